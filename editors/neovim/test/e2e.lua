-- End-to-end test of the Neovim plugin, run by a second Neovim as `nvim -l e2e.lua`.
--
-- Starts a real headless Neovim with test/init.lua (this plugin, `laya lsp --remote-url` on the
-- stub OpenAI server) and drives it over RPC with keystrokes, as a user types: writes a
-- function header in a Python file, asks for a suggestion with the plugin's trigger key, waits
-- for laya's suggestion (ghost text on 0.12+, the popup menu on 0.11), accepts it and checks
-- the buffer and the file on disk. Environment: NVIM_BIN (the Neovim under test), LAYA_BIN,
-- LAYA_REMOTE_URL, WORK (an empty folder). Exit status 0 when every check passed.
--
-- With LAYA_E2E_COLD=1 the editor starts from a cold daemon: none runs for LAYA_RUNTIME_DIR,
-- `laya lsp` starts it and it loads the real 0.5B; the first request (the popup asked for right
-- after the editor attached) must be answered with laya's item once the model has loaded.

local nvim_bin = assert(vim.env.NVIM_BIN, 'NVIM_BIN')
local work = assert(vim.env.WORK, 'WORK')
local here = vim.fs.dirname(debug.getinfo(1, 'S').source:sub(2))
local sock = work .. '/nvim.sock'
local file = work .. '/project/main.py'
vim.fn.mkdir(work .. '/project/.git', 'p')

local cold = vim.env.LAYA_E2E_COLD == '1'
local failures = 0
local function log(...)
  io.stdout:write(table.concat(vim.tbl_map(tostring, { ... }), ' ') .. '\n')
end
local function check(ok, what, detail)
  if ok then
    log('  ok: ' .. what)
  else
    failures = failures + 1
    log('  FAILED: ' .. what .. (detail and ('\n    ' .. detail) or ''))
  end
  return ok
end

-- The editor runs with a real terminal UI inside this Neovim's terminal emulator, so its
-- popup menu is drawn as a user sees it; its screen is this buffer's text.
vim.o.columns, vim.o.lines = 100, 30
local term_buf = vim.api.nvim_get_current_buf()
local job = vim.fn.jobstart({ nvim_bin, '--listen', sock, '-n', '-i', 'NONE', '-u', here .. '/init.lua', file }, {
  term = true,
  env = {
    TERM = 'xterm-256color',
    XDG_CONFIG_HOME = work .. '/config',
    XDG_DATA_HOME = work .. '/data',
    XDG_STATE_HOME = work .. '/state',
  },
})
assert(job > 0, 'could not start ' .. nvim_bin)
local ch
vim.wait(10000, function()
  local ok, c = pcall(vim.fn.sockconnect, 'pipe', sock, { rpc = true })
  if ok and c > 0 then
    ch = c
    return true
  end
  return false
end, 50)
assert(ch, 'the editor did not listen on ' .. sock)

--- The editor's screen as text.
local function screen()
  return table.concat(vim.api.nvim_buf_get_lines(term_buf, 0, -1, false), '\n')
end
local artifacts = vim.env.ARTIFACTS

local function lua(code, ...)
  return vim.rpcrequest(ch, 'nvim_exec_lua', code, { ... })
end
local function input(keys)
  vim.rpcrequest(ch, 'nvim_input', keys)
end
--- Polls `code` in the editor until it returns a truthy value; returns that value or nil.
local function wait_for(ms, code, ...)
  local value
  local args = { ... }
  vim.wait(ms, function()
    value = lua(code, unpack(args))
    return value and value ~= vim.NIL
  end, 50)
  return value ~= vim.NIL and value or nil
end

local version = lua('return tostring(vim.version())')
local inline = lua('return vim.lsp.inline_completion ~= nil and vim.lsp.inline_completion.enable ~= nil')
log(('Neovim %s under test (%s%s)'):format(version, inline and 'inline completion' or 'completion popup',
  cold and ', cold daemon, real model' or ''))

check(wait_for(15000, [[
  local c = (vim.lsp.get_clients or vim.lsp.get_active_clients)({ name = 'laya', bufnr = 0 })[1]
  return c and c.initialized and c.id
]]) ~= nil, 'laya attached to the Python buffer')
if cold then
  local status = lua([[return require('laya').status()]])
  check(status == 'starting' or status == 'loading', 'status() reports the model loading', status)
else
  check(lua([[return require('laya').status()]]) == 'ready', 'status() reports ready (remote tier)', lua([[return require('laya').status()]]))
end

--- Types `header` on a new line, waits for the ghost text (0.12+) or asks for the popup with
--- <C-Space> (0.11), accepts the suggestion, and checks the buffer's lines from the header on.
--- `expected` nil (the real model): whatever single line laya suggests, which must not be empty;
--- `wait_ms`: how long the suggestion may take.
local function complete_after(header, expected, wait_ms)
  wait_ms = wait_ms or 5000
  log(('case %q'):format(header))
  local start = lua('return vim.api.nvim_buf_line_count(0)')
  -- A fresh line at the end, then the header; Enter gives Python's indent.
  input('<Esc>Go' .. header:gsub('<', '<lt>') .. '<CR>')
  check(wait_for(3000, [[return vim.fn.mode() == 'i' and vim.fn.getline('.') == '    ']]), 'auto-indent in insert mode', lua([[return vim.inspect({vim.fn.mode(), vim.fn.getline('.')})]]))
  if inline then
    -- Ghost text asks by itself once typing pauses.
    local shown = wait_for(wait_ms, [[
      local ns = vim.api.nvim_get_namespaces()['nvim.lsp.inline_completion']
      if not ns then return nil end
      local marks = vim.api.nvim_buf_get_extmarks(0, ns, 0, -1, { details = true })
      local out = {}
      for _, m in ipairs(marks) do
        for _, chunk in ipairs(m[4].virt_text or {}) do out[#out + 1] = chunk[1] end
      end
      return #out > 0 and table.concat(out) or nil
    ]])
    expected = expected or (shown and '    ' .. vim.trim(shown))
    check(shown ~= nil and vim.trim(shown) ~= '' and vim.trim(expected):find(vim.trim(shown), 1, true) ~= nil, 'ghost text shown', vim.inspect(shown))
    input('<Tab>')
  else
    input('<C-Space>')
    local menu = wait_for(wait_ms, [[
      if vim.fn.pumvisible() == 0 then return nil end
      return vim.fn.complete_info({ 'items', 'selected' })
    ]])
    local first = menu and menu.items and menu.items[1]
    expected = expected or (first and first.abbr ~= '' and '    ' .. first.abbr) or '(no item)'
    check(first ~= nil and first.abbr == vim.trim(expected), 'the popup menu holds laya\'s item', vim.inspect(menu))
    -- The popup as drawn: a screen row with the item's label and laya's detail.
    local label = vim.trim(expected)
    local drawn = vim.wait(3000, function()
      for _, row in ipairs(vim.split(screen(), '\n')) do
        if row:find(label, 1, true) and row:find('laya', 1, true) then
          return true
        end
      end
      return false
    end, 50)
    if artifacts then
      vim.fn.writefile(vim.split(screen(), '\n'), ('%s/neovim-popup-%s.txt'):format(artifacts, header:match('def (%w+)')))
    end
    check(drawn, 'the popup is drawn on the screen', screen())
    if menu and menu.selected == -1 then
      input('<C-n>')
    end
    input('<C-y>')
  end
  -- Accepting runs asynchronously (CompleteDone, snippet expansion): wait for the text.
  local want = { header, expected }
  local got = wait_for(3000, [[
    local from, want = ...
    local lines = vim.api.nvim_buf_get_lines(0, from, -1, false)
    return vim.deep_equal(lines, want) and lines or nil
  ]], start, want)
  got = got or lua('return vim.api.nvim_buf_get_lines(0, ..., -1, false)', start)
  check(vim.deep_equal(got, want), 'buffer after accepting', 'want ' .. vim.inspect(want) .. '\n    got  ' .. vim.inspect(got))
  input('<Esc>')
  return expected
end

local want = { '' }
if cold then
  -- The first request: asked for as soon as the editor attached, while the model loads.
  local got = complete_after('def add(a, b):', nil, 300000)
  vim.list_extend(want, { 'def add(a, b):', got })
  check(wait_for(10000, [[return require('laya').status() == 'ready' or nil]]) ~= nil, 'status() reports the model ready', lua([[return require('laya').status()]]))
else
  complete_after('def add(a, b):', '    return a + b')
  -- `$`, `{`, `}` and `\` must arrive literally (snippet escaping on the popup path).
  complete_after('def price(x):', [[    return f"${x:.2f}" + "\\"]])
  vim.list_extend(want, { 'def add(a, b):', '    return a + b', 'def price(x):', [[    return f"${x:.2f}" + "\\"]] })
end

-- Write the file and read it back from disk.
input('<Esc>:w<CR>')
vim.wait(3000, function()
  return vim.fn.filereadable(file) == 1 and #vim.fn.readfile(file) >= #want
end, 50)
local disk = vim.fn.filereadable(file) == 1 and vim.fn.readfile(file) or {}
-- The buffer started empty: its first line stays empty.
check(vim.deep_equal(disk, want), 'file on disk', 'want ' .. vim.inspect(want) .. '\n    got  ' .. vim.inspect(disk))

-- Accepting ran the items' `laya.accept` command through Neovim's client.
local acc = wait_for(3000, [[
  local a = require('laya').acceptance()
  local n = ...
  return a and a.full >= n and a or nil
]], cold and 1 or 2)
check(acc ~= nil, 'laya counted the acceptances (the command or the edit)', vim.inspect(lua([[return require('laya').acceptance()]])))

pcall(vim.rpcrequest, ch, 'nvim_command', 'qa!')
vim.fn.jobwait({ job }, 5000)
vim.fn.jobstop(job)
log(failures == 0 and 'neovim e2e: all checks passed' or ('neovim e2e: %d check(s) failed'):format(failures))
os.exit(failures == 0 and 0 or 1)
