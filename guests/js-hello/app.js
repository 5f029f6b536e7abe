// A wasi:http/proxy component in JavaScript with an explicit
// `incomingHandler` export, built with componentize-js
// (guests/toolchains.sh). GET / answers a greeting; POST /echo answers the
// request body with two set-cookie headers.
import { Fields, OutgoingBody, OutgoingResponse, ResponseOutparam } from 'wasi:http/types@0.2.12';

function readBody(request) {
  const body = request.consume();
  const stream = body.stream();
  const chunks = [];
  let total = 0;
  for (;;) {
    let chunk;
    try {
      chunk = stream.blockingRead(65536n);
    } catch (e) {
      if (e.payload && e.payload.tag === 'closed') break;
      throw e;
    }
    chunks.push(chunk);
    total += chunk.length;
  }
  stream[Symbol.dispose]?.();
  const out = new Uint8Array(total);
  let at = 0;
  for (const chunk of chunks) {
    out.set(chunk, at);
    at += chunk.length;
  }
  return out;
}

function respond(responseOut, status, headers, data) {
  const response = new OutgoingResponse(Fields.fromList(headers));
  response.setStatusCode(status);
  const body = response.body();
  ResponseOutparam.set(responseOut, { tag: 'ok', val: response });
  const stream = body.write();
  for (let i = 0; i < data.length; i += 4096) {
    stream.blockingWriteAndFlush(data.subarray(i, i + 4096));
  }
  stream[Symbol.dispose]?.();
  OutgoingBody.finish(body, undefined);
}

const encoder = new TextEncoder();

export const incomingHandler = {
  handle(request, responseOut) {
    const path = request.pathWithQuery() || '/';
    if (path === '/echo') {
      const data = readBody(request);
      respond(responseOut, 200, [
        ['content-type', encoder.encode('application/octet-stream')],
        ['set-cookie', encoder.encode('a=1; Path=/')],
        ['set-cookie', encoder.encode('b=2; Path=/')],
      ], data);
    } else if (path === '/') {
      respond(responseOut, 200, [['content-type', encoder.encode('text/plain')]], encoder.encode('hello from javascript\n'));
    } else {
      respond(responseOut, 404, [['content-type', encoder.encode('text/plain')]], encoder.encode('not found\n'));
    }
  },
};
