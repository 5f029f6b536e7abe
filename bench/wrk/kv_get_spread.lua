-- 10,000 keys, read uniformly at random.
math.randomseed(1)
request = function()
  return wrk.format("GET", "/kv/get?store=main&key=k" .. math.random(1, 10000))
end
