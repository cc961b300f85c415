import { createServer, connect as connectTcp, type Server, type Socket } from 'node:net'

/**
 * A TCP forwarder in front of PostgreSQL that records how each client began:
 * whether its first message was an SSLRequest (8 bytes: length 8, code
 * 80877103) or a StartupMessage (protocol 3.0, 196608), which carries the
 * user and database in plain text and is followed by the authentication. A
 * client that asked for TLS and heard 'N' (a server without TLS, as the
 * test's) and then sends a StartupMessage anyway spoke plain text: `plain`
 * counts every StartupMessage seen at the start of a chunk, whenever it came.
 * Bytes go on to the real server, so a client that may speak plain text works.
 */
export interface StartupRecorder {
  /** `databaseUrl` with its host and port replaced by the recorder's, on 0.0.0.0: not loopback by its name, so the start check counts it as another host (Linux routes it here). */
  readonly url: string
  readonly port: number
  /** Per connection, in order: the kind of each message that began a chunk the client sent before TLS (if any) started. */
  readonly connections: readonly (readonly MessageKind[])[]
  /** StartupMessages seen in plain text, all connections together. */
  plain(): number
  /** SSLRequests seen. */
  sslRequests(): number
  stop(): Promise<void>
}

export type MessageKind = 'ssl-request' | 'gss-request' | 'startup' | 'tls' | 'other'

const SSL_REQUEST = 80_877_103
const GSS_REQUEST = 80_877_104
const PROTOCOL_3 = 196_608

function kindOf(chunk: Buffer): MessageKind {
  if (chunk[0] === 0x16) return 'tls' // a TLS handshake record (ClientHello)
  if (chunk.length < 8) return 'other'
  const code = chunk.readUInt32BE(4)
  if (chunk.readUInt32BE(0) === 8 && code === SSL_REQUEST) return 'ssl-request'
  if (chunk.readUInt32BE(0) === 8 && code === GSS_REQUEST) return 'gss-request'
  if (code === PROTOCOL_3) return 'startup'
  return 'other'
}

export async function startStartupRecorder(databaseUrl: string): Promise<StartupRecorder> {
  const upstream = new URL(databaseUrl)
  const upstreamHost = upstream.hostname.replace(/^\[|\]$/g, '')
  const upstreamPort = Number(upstream.port || 5432)
  const connections: MessageKind[][] = []
  const sockets = new Set<Socket>()
  const server: Server = createServer((client) => {
    const kinds: MessageKind[] = []
    connections.push(kinds)
    // Once a TLS handshake began, the rest is ciphertext (or garbage to a server without TLS): not classified.
    let tls = false
    const server = connectTcp(upstreamPort, upstreamHost)
    sockets.add(client)
    sockets.add(server)
    client.on('data', (chunk: Buffer) => {
      if (!tls) {
        const kind = kindOf(chunk)
        kinds.push(kind)
        if (kind === 'tls') tls = true
      }
      server.write(chunk)
    })
    server.on('data', (chunk: Buffer) => client.write(chunk))
    const end = () => {
      client.destroy()
      server.destroy()
      sockets.delete(client)
      sockets.delete(server)
    }
    client.on('close', end)
    server.on('close', end)
    client.on('error', end)
    server.on('error', end)
  })
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve))
  const port = (server.address() as { port: number }).port
  const url = new URL(databaseUrl)
  url.hostname = '0.0.0.0'
  url.port = String(port)
  const count = (kind: MessageKind) => connections.reduce((sum, kinds) => sum + kinds.filter((seen) => seen === kind).length, 0)
  return {
    url: url.toString(),
    port,
    connections,
    plain: () => count('startup'),
    sslRequests: () => count('ssl-request'),
    async stop() {
      for (const socket of sockets) socket.destroy()
      await new Promise<void>((resolve) => server.close(() => resolve()))
    },
  }
}
