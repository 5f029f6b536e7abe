# A wasi:http/proxy component in Python, built with componentize-py
# (guests/toolchains.sh). GET / answers a greeting; POST /echo answers the
# request body with two set-cookie headers, which must reach the client as
# two separate header lines. The tests compare every byte with what this
# file means to send.
from wit_world import exports
from wit_world.imports import streams
from wit_world.imports.types import (
    Fields,
    IncomingRequest,
    OutgoingBody,
    OutgoingResponse,
    ResponseOutparam,
)
from componentize_py_types import Ok, Err


def read_body(request):
    chunks = []
    with request.consume() as body:
        with body.stream() as stream:
            while True:
                try:
                    chunks.append(stream.blocking_read(65536))
                except Err as e:
                    if isinstance(e.value, streams.StreamError_Closed):
                        break
                    raise
    return b"".join(chunks)


def respond(response_out, status, headers, data):
    response = OutgoingResponse(Fields.from_list(headers))
    response.set_status_code(status)
    body = response.body()
    ResponseOutparam.set(response_out, Ok(response))
    with body.write() as stream:
        for i in range(0, len(data), 4096):
            stream.blocking_write_and_flush(data[i : i + 4096])
    OutgoingBody.finish(body, None)


class IncomingHandler(exports.IncomingHandler):
    def handle(self, request: IncomingRequest, response_out: ResponseOutparam) -> None:
        path = request.path_with_query() or "/"
        if path == "/echo":
            data = read_body(request)
            respond(
                response_out,
                200,
                [
                    ("content-type", b"application/octet-stream"),
                    ("set-cookie", b"a=1; Path=/"),
                    ("set-cookie", b"b=2; Path=/"),
                ],
                data,
            )
        elif path == "/":
            respond(response_out, 200, [("content-type", b"text/plain")], b"hello from python\n")
        else:
            respond(response_out, 404, [("content-type", b"text/plain")], b"not found\n")
