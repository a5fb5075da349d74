-- User commands for laya (see lua/laya/init.lua; `require('laya').setup()` starts it).
if vim.g.loaded_laya then
  return
end
vim.g.loaded_laya = true

vim.api.nvim_create_user_command('Laya', function(args)
  local laya = require('laya')
  local sub = args.fargs[1] or 'status'
  if sub == 'toggle' then
    laya.toggle()
  elseif sub == 'status' then
    local s = laya.status()
    local msg = laya.state.message ~= '' and (' (' .. laya.state.message .. ')') or ''
    vim.notify('laya: ' .. s .. msg)
  elseif sub == 'acceptance' then
    vim.notify('laya: ' .. vim.inspect(laya.acceptance()))
  elseif sub == 'log' then
    vim.cmd('edit ' .. vim.fn.fnameescape(vim.lsp.get_log_path()))
  else
    vim.notify('laya: unknown subcommand ' .. sub .. ' (status, toggle, acceptance, log)', vim.log.levels.ERROR)
  end
end, {
  nargs = '?',
  complete = function()
    return { 'status', 'toggle', 'acceptance', 'log' }
  end,
  desc = 'laya: status | toggle | acceptance | log',
})
