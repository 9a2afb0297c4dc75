-- PUTs of 100-byte values under fresh random keys, for
--   replicator serve --cluster-id a --data /tmp/hd --listen 127.0.0.1:7499
--   wrk -t2 -c64 -d10s -s docs/perf/wrk-put.lua http://127.0.0.1:7499/
counter = 0
request = function()
  counter = counter + 1
  local path = "/v1/kv/wrk-" .. tostring(math.random(1, 1000000000)) .. "-" .. counter
  return wrk.format("PUT", path, nil, string.rep("v", 100))
end
