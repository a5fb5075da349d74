--- laya for Neovim: runs `laya lsp` through Neovim's own LSP client.
---
--- Neovim 0.12+ shows laya's suggestions as ghost text (`vim.lsp.inline_completion`); older
--- versions get them as completion items in the popup menu (`vim.lsp.completion` on 0.11,
--- 'omnifunc' before). Configuration goes through `vim.lsp.config` (0.11+), nvim-lspconfig
--- when it is installed on older versions, or a plain `vim.lsp.start` otherwise.

local M = {}

--- Defaults; `setup()` merges the user's options over them.
M.defaults = {
  --- The `laya` binary (absolute path, or a name on $PATH).
  path = 'laya',
  --- `--model`: a name from `laya models list` (e.g. 'qwen2.5-coder-1.5b'), a GGUF file or a folder.
  model = nil,
  --- `--precision`: 'native' | 'q4' | 'q6' | 'q8'.
  precision = nil,
  --- Remote tier: an OpenAI-compatible completions endpoint (`--remote-url`).
  remote_url = nil,
  --- `--remote-model`: the model name the remote tier is asked for.
  remote_model = nil,
  --- More arguments for `laya lsp`.
  args = {},
  --- Full command; overrides path/model/precision/remote_*/args when set.
  cmd = nil,
  --- Filetypes to attach to; nil attaches to every file buffer.
  filetypes = nil,
  --- Files that mark a project root (sent to laya as the workspace folder).
  root_markers = { '.git' },
  --- laya's settings (`initializationOptions` and the `laya` section of workspace/configuration).
  settings = {
    completion = {
      -- debounceMs = 75,  -- unset: the wait follows the typing pace
      maxTokensLine = 48,
      maxTokensBlock = 128,
      candidates = 1,
      languages = {},
    },
  },
  --- Ghost text through `vim.lsp.inline_completion` when Neovim has it (0.12+).
  inline = true,
  --- Insert-mode key that accepts the ghost text (falls through to the key itself when none
  --- is shown); false for no mapping.
  accept_key = '<Tab>',
  --- Insert-mode key that opens the popup menu with a suggestion (before 0.12; ghost text asks
  --- by itself); false for no mapping.
  trigger_key = '<C-Space>',
  --- Popup fallback (before 0.12): 'completeopt' for laya's buffers, so that a single
  --- suggestion still shows a menu (menuone) and is accepted with <C-y> (noinsert); false
  --- leaves 'completeopt' alone.
  completeopt = 'menu,menuone,noinsert,popup',
  --- Popup fallback (before 0.12): also ask by itself after typing stops for this many ms
  --- (0 = only on `trigger_key`).
  auto_popup_ms = 0,
  --- Called with (client, bufnr) when laya attaches to a buffer.
  on_attach = nil,
}

M.options = vim.deepcopy(M.defaults)

--- Model state from laya's `$/progress` (token `laya/model`): 'starting' | 'loading' |
--- 'ready' | 'error', and the server's message.
M.state = { model = 'starting', message = '' }

local enabled = true
local group = vim.api.nvim_create_augroup('laya', { clear = true })

--- Clients named laya (`vim.lsp.get_clients` is 0.10+).
local function laya_clients()
  local get = vim.lsp.get_clients or vim.lsp.get_active_clients
  return get({ name = 'laya' })
end

local function keycode(keys)
  return vim.api.nvim_replace_termcodes(keys, true, false, true)
end

local function has_inline()
  return vim.lsp.inline_completion ~= nil and vim.lsp.inline_completion.enable ~= nil
end

--- The command line for `laya lsp`.
function M.cmd(opts)
  opts = opts or M.options
  if opts.cmd then
    return opts.cmd
  end
  local cmd = { opts.path or 'laya', 'lsp' }
  local function flag(name, value)
    if value and value ~= '' then
      vim.list_extend(cmd, { name, value })
    end
  end
  flag('--model', opts.model)
  flag('--precision', opts.precision)
  flag('--remote-url', opts.remote_url)
  flag('--remote-model', opts.remote_model)
  vim.list_extend(cmd, opts.args or {})
  return cmd
end

--- Escapes text for an LSP snippet: `$`, `}` and `\` are literal only when escaped.
function M.snippet_escape(text)
  return (text:gsub('[\\$}]', '\\%0'))
end

--- Neovim before 0.12 inserts a plain-text completion item only up to its first whitespace;
--- a snippet is inserted whole (the popup shows its first line). Turns laya's plain-text
--- items into snippets in place, once: an item that is already a snippet is left alone.
local function as_snippet(item)
  if item.insertTextFormat ~= 2 then
    if item.textEdit and item.textEdit.newText then
      item.textEdit.newText = M.snippet_escape(item.textEdit.newText)
    elseif item.insertText then
      item.insertText = M.snippet_escape(item.insertText)
    else
      item.insertText = M.snippet_escape(item.label)
    end
    item.insertTextFormat = 2
  end
  return {}
end

--- Asks for a suggestion now in the completion popup (before 0.12). Ghost text (0.12+) asks by
--- itself whenever typing pauses, so it needs no key.
function M.trigger()
  if not enabled then
    return
  end
  if vim.lsp.completion and vim.lsp.completion.get then
    vim.lsp.completion.get()
  else
    vim.api.nvim_feedkeys(keycode('<C-x><C-o>'), 'n', false)
  end
end

local function attach_inline(client, bufnr)
  vim.lsp.inline_completion.enable(enabled, { bufnr = bufnr, client_id = client.id })
  if M.options.accept_key then
    vim.keymap.set('i', M.options.accept_key, function()
      if enabled and vim.lsp.inline_completion.get({ bufnr = 0 }) then
        return ''
      end
      return M.options.accept_key
    end, { buffer = bufnr, expr = true, replace_keycodes = true, desc = 'laya: accept the suggestion' })
  end
end

local function attach_popup(client, bufnr)
  if vim.lsp.completion and vim.lsp.completion.enable then
    vim.lsp.completion.enable(true, client.id, bufnr, { autotrigger = false, convert = as_snippet })
    if M.options.completeopt then
      pcall(function()
        vim.bo[bufnr].completeopt = M.options.completeopt
      end)
    end
    if M.options.auto_popup_ms > 0 then
      local timer = assert(vim.uv.new_timer())
      vim.api.nvim_create_autocmd('TextChangedI', {
        group = group,
        buffer = bufnr,
        callback = function()
          timer:stop()
          timer:start(M.options.auto_popup_ms, 0, vim.schedule_wrap(function()
            if enabled and vim.fn.mode() == 'i' and vim.fn.pumvisible() == 0 and vim.api.nvim_get_current_buf() == bufnr then
              vim.lsp.completion.get()
            end
          end))
        end,
      })
    end
  else
    vim.bo[bufnr].omnifunc = 'v:lua.vim.lsp.omnifunc'
  end
end

local function on_attach(client, bufnr)
  if M.options.inline and has_inline() then
    attach_inline(client, bufnr)
  else
    attach_popup(client, bufnr)
  end
  if M.options.trigger_key and not (M.options.inline and has_inline()) then
    vim.keymap.set('i', M.options.trigger_key, M.trigger, { buffer = bufnr, desc = 'laya: suggest' })
  end
  if M.options.on_attach then
    M.options.on_attach(client, bufnr)
  end
end

local function on_progress(token, value)
  if token ~= 'laya/model' or type(value) ~= 'table' then
    return
  end
  if value.kind == 'begin' then
    M.state = { model = 'loading', message = value.title or '' }
  elseif value.kind == 'end' then
    local msg = value.message or ''
    M.state = { model = (msg:match('^fail') or msg:match('error')) and 'error' or 'ready', message = msg }
  end
  vim.api.nvim_exec_autocmds('User', { pattern = 'LayaStatus', modeline = false })
end

--- The client configuration (the table `vim.lsp.config('laya', …)` takes).
function M.config(opts)
  opts = opts or M.options
  return {
    name = 'laya',
    cmd = M.cmd(opts),
    filetypes = opts.filetypes,
    root_markers = opts.root_markers,
    init_options = opts.settings,
    settings = { laya = opts.settings },
    on_attach = on_attach,
    handlers = {
      ['$/progress'] = function(err, result, ctx, config)
        if result then
          on_progress(result.token, result.value)
        end
        return vim.lsp.handlers['$/progress'](err, result, ctx, config)
      end,
    },
  }
end

--- Sets laya up: `require('laya').setup({ path = '/path/to/laya', model = 'qwen2.5-coder-1.5b' })`.
function M.setup(opts)
  M.options = vim.tbl_deep_extend('force', vim.deepcopy(M.defaults), opts or {})
  M.state = { model = 'starting', message = '' }
  local cfg = M.config()
  if vim.lsp.config and vim.lsp.enable then
    -- Neovim 0.11+: the built-in configuration (also found as lsp/laya.lua on 'runtimepath').
    vim.lsp.config('laya', cfg)
    vim.lsp.enable('laya')
    return
  end
  local ok, configs = pcall(require, 'lspconfig.configs')
  if ok then
    -- Older Neovim with nvim-lspconfig.
    if not configs.laya then
      configs.laya = {
        default_config = vim.tbl_extend('force', cfg, {
          root_dir = require('lspconfig.util').root_pattern(unpack(M.options.root_markers)),
        }),
      }
    end
    require('lspconfig').laya.setup({})
    return
  end
  -- Older Neovim without lspconfig: start the client for each file buffer.
  vim.api.nvim_create_autocmd('FileType', {
    group = group,
    pattern = cfg.filetypes or '*',
    callback = function(args)
      if vim.bo[args.buf].buftype ~= '' then
        return
      end
      local root = vim.fs and vim.fs.find(M.options.root_markers, {
        upward = true,
        path = vim.fs.dirname(vim.api.nvim_buf_get_name(args.buf)),
      })[1]
      local start = vim.tbl_extend('force', cfg, { root_dir = root and vim.fs.dirname(root) or vim.fn.getcwd() })
      vim.lsp.start(start, { bufnr = args.buf })
    end,
  })
end

--- Turns suggestions on or off (all buffers).
function M.toggle()
  enabled = not enabled
  if has_inline() and M.options.inline then
    for _, client in ipairs(laya_clients()) do
      for bufnr in pairs(client.attached_buffers) do
        vim.lsp.inline_completion.enable(enabled, { bufnr = bufnr, client_id = client.id })
      end
    end
  end
  vim.notify('laya: suggestions ' .. (enabled and 'on' or 'off'))
  return enabled
end

--- 'off', or the model state: 'starting' | 'loading' | 'ready' | 'error'. For a statusline:
--- `%{v:lua.require'laya'.status()}`.
function M.status()
  if not enabled then
    return 'off'
  end
  if #laya_clients() == 0 then
    return 'stopped'
  end
  if M.options.remote_url and M.state.model == 'starting' then
    return 'ready'
  end
  return M.state.model
end

--- Counts of suggestions shown and accepted, from the server (`laya/acceptance`).
function M.acceptance()
  local client = laya_clients()[1]
  if not client then
    return nil
  end
  local res
  if vim.fn.has('nvim-0.11') == 1 then
    res = client:request_sync('laya/acceptance', vim.empty_dict(), 2000)
  else
    res = client.request_sync('laya/acceptance', vim.empty_dict(), 2000)
  end
  return res and res.result
end

return M
