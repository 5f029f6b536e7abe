// A JavaScript component in the `addEventListener("fetch")` style, which
// most JS users write, built with componentize-js (guests/toolchains.sh).
// StarlingMonkey provides its incoming-handler and cannot serve a second
// request on one instance: Weir serves it one event per generation.
addEventListener('fetch', (event) => event.respondWith(handle(event.request)));

async function handle(request) {
  const url = new URL(request.url);
  if (url.pathname === '/echo') {
    const body = await request.arrayBuffer();
    const headers = new Headers({ 'content-type': 'application/octet-stream' });
    headers.append('set-cookie', 'a=1; Path=/');
    headers.append('set-cookie', 'b=2; Path=/');
    return new Response(body, { headers });
  }
  if (url.pathname === '/') {
    return new Response('hello from a fetch event\n', { headers: { 'content-type': 'text/plain' } });
  }
  return new Response('not found\n', { status: 404, headers: { 'content-type': 'text/plain' } });
}
