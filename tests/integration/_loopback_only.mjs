// Preloaded into the npm MCP servers the tests start (node --import): a server that listens on
// a port without naming a host listens on 127.0.0.1 only (the house rule: everything a test
// starts binds loopback). @modelcontextprotocol/server-everything calls app.listen(PORT).
import net from "node:net";

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const port = args[0];
  const isPort = typeof port === "number" || (typeof port === "string" && /^\d+$/.test(port));
  if (isPort && typeof args[1] !== "string") {
    args.splice(1, 0, "127.0.0.1");
  }
  return listen.apply(this, args);
};
