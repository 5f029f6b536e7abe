;; A wasi:http component built to exhaust the compiler, not the runtime.
;;
;; The tests put in its core module, in place of the word in capitals below,
;; functions that are each one long chain of additions to a local. Such Wasm is small (7 bytes
;; an addition) and Cranelift's memory for it is not: two functions of
;; 100,000 additions (1.4 MB) take it past 1 GB. Its handler, were it ever
;; served, answers nothing (502 `invalid_response`).
(component
  (import "wasi:http/types@0.2.0" (instance $types
    (export "incoming-request" (type (sub resource)))
    (export "response-outparam" (type (sub resource)))
  ))
  (alias export $types "incoming-request" (type $request))
  (alias export $types "response-outparam" (type $outparam))

  (core func $drop_request (canon resource.drop $request))
  (core func $drop_outparam (canon resource.drop $outparam))

  (core module $main
    (import "host" "drop-request" (func $drop_request (param i32)))
    (import "host" "drop-outparam" (func $drop_outparam (param i32)))
    FUNCTIONS
    (func (export "handle") (param i32 i32)
      (call $drop_request (local.get 0))
      (call $drop_outparam (local.get 1))))
  (core instance $host
    (export "drop-request" (func $drop_request))
    (export "drop-outparam" (func $drop_outparam)))
  (core instance $main_instance (instantiate $main (with "host" (instance $host))))

  (func $handle (param "request" (own $request)) (param "response-out" (own $outparam))
    (canon lift (core func $main_instance "handle")))
  (instance $handler (export "handle" (func $handle)))
  (export "wasi:http/incoming-handler@0.2.0" (instance $handler))
)
