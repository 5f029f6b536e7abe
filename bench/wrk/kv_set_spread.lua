-- 10,000 keys, written uniformly at random (64-byte values).
math.randomseed(2)
local body = string.rep("v", 64)
request = function()
  return wrk.format("PUT", "/kv/set?store=main&key=k" .. math.random(1, 10000), nil, body)
end
