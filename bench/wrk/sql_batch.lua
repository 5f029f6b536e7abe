-- A two-statement batch per request: insert a row, read a count back.
math.randomseed(3)
request = function()
  local body = '{"db":"app","statements":[' ..
    '{"sql":"INSERT INTO items (k, v) VALUES (?1, ?2)","params":[' .. math.random(1, 1000000) .. ',"value"]},' ..
    '{"sql":"SELECT count(*) FROM items WHERE k < ?1","params":[1000]}]}'
  return wrk.format("POST", "/batch", nil, body)
end
