-- The editor's configuration in the end-to-end test: this plugin from the checkout, laya from
-- $LAYA_BIN, completions from the stub OpenAI server at $LAYA_REMOTE_URL.
local here = vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2))
vim.opt.runtimepath:prepend(vim.fs.dirname(here))
vim.cmd('filetype plugin indent on')
vim.o.swapfile = false
vim.o.expandtab = true
vim.o.shiftwidth = 4
vim.lsp.set_log_level(vim.env.LAYA_NVIM_LOG_LEVEL or 'WARN')

require('laya').setup({
  path = vim.env.LAYA_BIN,
  remote_url = vim.env.LAYA_REMOTE_URL,
  settings = { completion = { debounceMs = 10 } },
})
