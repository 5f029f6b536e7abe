// The reference for bench/websockets.py: a Durable Object that accepts
// WebSockets with the hibernation API and echoes each message; every
// socket of a run goes to one object, as with Weir's room actor.
export class Echo {
  constructor(state) {
    this.state = state;
  }
  async fetch() {
    const [client, server] = Object.values(new WebSocketPair());
    this.state.acceptWebSocket(server);
    return new Response(null, { status: 101, webSocket: client });
  }
  async webSocketMessage(ws, message) {
    ws.send(message);
  }
  async webSocketClose(ws, code, reason) {
    ws.close(code, reason);
  }
}

export default {
  async fetch(request, env) {
    const name = new URL(request.url).pathname.slice(1) || "echo";
    return env.ECHO.get(env.ECHO.idFromName(name)).fetch(request);
  },
};
