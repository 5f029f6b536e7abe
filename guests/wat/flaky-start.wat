;; A wasi:http component whose instantiation fails inside a time window.
;;
;; Its core module has a start function that reads the wall clock and traps
;; when the time, in Unix seconds, is in [FAIL_FROM, FAIL_UNTIL): every
;; instance created in that window fails to instantiate, every instance
;; created outside it works. Before that check, the start function spins
;; for START_MS milliseconds of wall-clock time. The tests replace the
;; placeholders and use it to make a lane's fresh instantiation fail (or
;; hang) from outside while other lanes keep their live generations, and
;; as the small guest of the in-process tests. Its handler spins for HOLD_MS
;; milliseconds of wall-clock time (so that concurrent requests occupy
;; different lanes) and sets no response, so each request it serves is
;; answered 502 `invalid_response` by Weir.
(component
  (import "wasi:clocks/wall-clock@0.2.0" (instance $clock
    (type $datetime (record (field "seconds" u64) (field "nanoseconds" u32)))
    (export "datetime" (type $dt (eq $datetime)))
    (export "now" (func (result $dt)))
  ))
  (import "wasi:http/types@0.2.0" (instance $types
    (export "incoming-request" (type (sub resource)))
    (export "response-outparam" (type (sub resource)))
  ))
  (alias export $types "incoming-request" (type $request))
  (alias export $types "response-outparam" (type $outparam))

  (core module $memory_module (memory (export "memory") 1))
  (core instance $memory_instance (instantiate $memory_module))
  (alias core export $memory_instance "memory" (core memory $memory))

  (alias export $clock "now" (func $now))
  (core func $now_lowered (canon lower (func $now) (memory $memory)))
  (core func $drop_request (canon resource.drop $request))
  (core func $drop_outparam (canon resource.drop $outparam))

  (core module $main
    (import "host" "now" (func $now (param i32)))
    (import "host" "drop-request" (func $drop_request (param i32)))
    (import "host" "drop-outparam" (func $drop_outparam (param i32)))
    (import "host" "memory" (memory 1))
    (func $start
      (local $until i64)
      (local.set $until (i64.add (call $now_ms) (i64.const START_MS)))
      (block $started
        (loop $spin
          (br_if $started (i64.ge_u (call $now_ms) (local.get $until)))
          (br $spin)))
      (call $now (i32.const 0))
      (if (i32.and
            (i64.ge_u (i64.load (i32.const 0)) (i64.const FAIL_FROM))
            (i64.lt_u (i64.load (i32.const 0)) (i64.const FAIL_UNTIL)))
        (then unreachable)))
    (start $start)
    (func $now_ms (result i64)
      (call $now (i32.const 0))
      (i64.add
        (i64.mul (i64.load (i32.const 0)) (i64.const 1000))
        (i64.div_u (i64.extend_i32_u (i32.load (i32.const 8))) (i64.const 1000000))))
    (func (export "handle") (param i32 i32)
      (local $until i64)
      (local.set $until (i64.add (call $now_ms) (i64.const HOLD_MS)))
      (block $held
        (loop $spin
          (br_if $held (i64.ge_u (call $now_ms) (local.get $until)))
          (br $spin)))
      (call $drop_request (local.get 0))
      (call $drop_outparam (local.get 1))))
  (core instance $host
    (export "now" (func $now_lowered))
    (export "drop-request" (func $drop_request))
    (export "drop-outparam" (func $drop_outparam))
    (export "memory" (memory $memory)))
  (core instance $main_instance (instantiate $main (with "host" (instance $host))))

  (func $handle (param "request" (own $request)) (param "response-out" (own $outparam))
    (canon lift (core func $main_instance "handle")))
  (instance $handler (export "handle" (func $handle)))
  (export "wasi:http/incoming-handler@0.2.0" (instance $handler))
)
