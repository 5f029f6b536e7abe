-- 1,000 actors, uniformly at random: NAME in the URL's path becomes a1..a1000.
math.randomseed(3)
request = function()
  local path = string.gsub(wrk.path, "NAME", "a" .. math.random(1, 1000))
  return wrk.format("POST", path)
end
