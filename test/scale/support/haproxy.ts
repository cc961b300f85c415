/**
 * HAProxy (Debian's 2.6) in HTTP mode in front of service instances, started
 * by the test on a free port: round robin, /readyz health checks every
 * 500 ms, and a retry on another instance only when the connection could not
 * be made (the request never left HAProxy, so retrying a POST is harmless).
 */
import { writeFileSync } from 'node:fs'
import { join } from 'node:path'
import { findBinary, freePort, killGroup, start, tempDir, waitFor, type Started } from './processes'

export class HAProxy {
  private constructor(readonly port: number, readonly running: Started) {}

  static async start(backends: { name: string; port: number }[]): Promise<HAProxy> {
    const binary = findBinary('haproxy')
    if (!binary) throw new Error('haproxy not found (apt-get install -y haproxy)')
    const dir = tempDir('haproxy')
    const port = freePort()
    const config = join(dir, 'haproxy.cfg')
    writeFileSync(config, [
      'global',
      '  maxconn 4096',
      'defaults',
      '  mode http',
      '  timeout connect 1s',
      '  timeout client 60s',
      '  timeout server 60s',
      '  timeout http-keep-alive 10s',
      // Retry elsewhere only when no connection could be made: the POST was
      // never sent. Never on a timeout or an empty answer: the instance may
      // have acted on it (the idempotency key makes a client's own retry safe,
      // but that is the client's call, with its key).
      '  retries 2',
      '  retry-on conn-failure',
      '  option redispatch 1',
      'frontend api',
      `  bind 127.0.0.1:${port}`,
      '  default_backend services',
      'backend services',
      '  balance roundrobin',
      // HTTP/1.1 with a Host: HAProxy's default check (HTTP/1.0, no Host) got
      // 500 "Invalid URL" from the service, so every instance was marked down.
      '  option httpchk',
      '  http-check send meth GET uri /readyz ver HTTP/1.1 hdr Host localhost',
      '  http-check expect status 200',
      '  default-server inter 500ms fall 1 rise 2',
      ...backends.map((b) => `  server ${b.name} 127.0.0.1:${b.port} check`),
      '',
    ].join('\n'))
    // -db: foreground, no daemon; HAProxy may run as root (it binds an unprivileged port here).
    const running = start([binary, '-db', '-f', config])
    const proxy = new HAProxy(port, running)
    await waitFor(`HAProxy on ${port} with a healthy backend`, async () => {
      if (running.proc.exitCode !== null) throw new Error(`haproxy exited ${running.proc.exitCode}:\n${running.output()}`)
      return (await fetch(`${proxy.url}/readyz`).catch(() => undefined))?.status === 200
    }, 15_000, 100)
    return proxy
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`
  }

  async stop(): Promise<void> {
    killGroup(this.running.proc.pid, 'SIGTERM')
    await this.running.proc.exited
  }
}
