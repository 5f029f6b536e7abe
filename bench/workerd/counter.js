// The reference for bench/actors.py: a Durable Object counter of the same
// shape as Weir's actor-probe `/incr` (one get and one put per request),
// reached through a worker, with storage on local disk.
export class Counter {
  constructor(state) {
    this.state = state;
  }
  async fetch() {
    const n = ((await this.state.storage.get("n")) || 0) + 1;
    await this.state.storage.put("n", n);
    return new Response(String(n));
  }
}

export default {
  async fetch(request, env) {
    const name = new URL(request.url).pathname.slice(1) || "hot";
    return env.COUNTER.get(env.COUNTER.idFromName(name)).fetch(request);
  },
};
