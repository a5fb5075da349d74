-- Neovim 0.11+ finds this file for `vim.lsp.enable('laya')`: laya with the options of the last
-- `require('laya').setup()` (or the defaults: `laya` on $PATH, every filetype).
return require('laya').config()
