;; A wasi:http component that asks for a huge table.
;;
;; Its handler runs `table.grow` for GROW_BY funcref elements (each a
;; pointer or two of host memory: 100 million is gigabytes). A grow that
;; the host refuses returns -1, and the handler then traps: the request is
;; answered 503 `instance_abandoned`. A grow that the host allowed would
;; return, without a response (502 `invalid_response`), having made the
;; host allocate the table. The tests replace GROW_BY.
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
    (table $t 1 funcref)
    (func (export "handle") (param i32 i32)
      (if (i32.eq
            (table.grow $t (ref.null func) (i32.const GROW_BY))
            (i32.const -1))
        (then unreachable))
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
