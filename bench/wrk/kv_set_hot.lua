-- One hot key, written (a 64-byte value).
local body = string.rep("v", 64)
request = function()
  return wrk.format("PUT", "/kv/set?store=main&key=hot", nil, body)
end
