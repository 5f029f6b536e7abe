-- One hot key, read.
request = function()
  return wrk.format("GET", "/kv/get?store=main&key=hot")
end
