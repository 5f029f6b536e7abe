-- A one-statement read batch per request (a point lookup).
math.randomseed(4)
request = function()
  local body = '{"db":"app","statements":[{"sql":"SELECT v FROM items WHERE k = ?1","params":[' .. math.random(1, 1000000) .. ']}]}'
  return wrk.format("POST", "/batch", nil, body)
end
