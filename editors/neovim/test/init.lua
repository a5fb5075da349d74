-- The editor's configuration in the end-to-end test: this plugin from the checkout, laya from
-- $LAYA_BIN, completions from the stub OpenAI server at $LAYA_REMOTE_URL (or, with
-- LAYA_E2E_COLD=1, from a daemon `laya lsp` starts).
local here = vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2))
vim.opt.runtimepath:prepend(vim.fs.dirname(here))
vim.cmd('filetype plugin indent on')
vim.o.swapfile = false
vim.o.expandtab = true
vim.o.shiftwidth = 4
vim.lsp.set_log_level(vim.env.LAYA_NVIM_LOG_LEVEL or 'WARN')

-- LAYA_E2E_COLD=1: no remote tier: `laya lsp` starts the daemon itself (none runs for its
-- runtime directory) and the daemon loads the real 0.5B on the CPU; few tokens, as the CPU
-- decodes ~0.6 s a token.
if vim.env.LAYA_E2E_COLD == '1' then
  require('laya').setup({
    path = vim.env.LAYA_BIN,
    args = { '--small', 'qwen2.5-coder-0.5b', '--large', 'none', '--device', 'cpu', '--no-http' },
    settings = { completion = { debounceMs = 10, maxTokensLine = 4, maxTokensBlock = 4 } },
  })
else
  require('laya').setup({
    path = vim.env.LAYA_BIN,
    remote_url = vim.env.LAYA_REMOTE_URL,
    settings = { completion = { debounceMs = 10 } },
  })
end
