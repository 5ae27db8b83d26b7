// Start and stop `deltaserve serve` for the e2e tests. The server gets --port 0: it binds a free
// port itself and prints it in its "listening on" line, so tests running in parallel never race
// for a port (picking a free port here and handing it over could lose it to another test).
import { spawn } from 'node:child_process';

// args: the flags after `serve --host 127.0.0.1 --port 0`. Resolves to { child, port, base, log() }.
export function startServer(bin, args, { timeoutMs = 120000 } = {}) {
  const child = spawn(bin, ['serve', '--host', '127.0.0.1', '--port', '0', ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`server did not start:\n${log}`)), timeoutMs);
    const onExit = (code) => { clearTimeout(timer); reject(new Error(`server exited ${code}:\n${log}`)); };
    let started = false;
    const onData = (d) => {
      log += d.toString();
      const m = !started && log.match(/listening on http:\/\/[^\s]*:(\d+)/);
      if (!m) return;
      started = true;
      clearTimeout(timer);
      child.removeListener('exit', onExit);
      const port = Number(m[1]);
      resolve({ child, port, base: `http://127.0.0.1:${port}`, log: () => log });
    };
    child.stdout.on('data', onData);
    child.stderr.on('data', onData);
    child.on('exit', onExit);
  });
}

// SIGTERM, then SIGKILL after 10 s; resolves once the process is gone.
export function stopServer(server) {
  if (!server) return Promise.resolve();
  return new Promise((resolve) => {
    if (server.child.exitCode !== null || server.child.signalCode !== null) return resolve();
    server.child.on('exit', () => resolve());
    server.child.kill('SIGTERM');
    setTimeout(() => { server.child.kill('SIGKILL'); resolve(); }, 10000).unref();
  });
}
