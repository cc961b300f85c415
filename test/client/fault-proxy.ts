import type { Socket, TCPSocketListener } from 'bun'

/**
 * What the proxy does with one client connection:
 * - 'refuse': closes it at once, before reading anything (the request never reaches the server);
 * - 'cut': forwards the request, then lets only the first bytes of the answer through and closes
 *   (the server did the work, the client never learns the result);
 * - 'pass': forwards both ways.
 */
export type Fault = 'refuse' | 'cut' | 'pass'

export interface FaultProxy {
  readonly url: string
  /** Connections seen so far, by what was done to them. */
  readonly counts: Record<Fault, number>
  /** Of the 'cut' connections, those whose answer had started to arrive when cut. */
  readonly cutAnswers: () => number
  stop(): void
}

/** Bytes of an answer let through before a cut: part of the status line, never a whole answer. */
const CUT_AFTER_BYTES = 12

interface Pair {
  fault: Fault
  upstream?: Socket<undefined>
  pending: Uint8Array[]
  closed: boolean
}

/**
 * A TCP proxy in front of the service that breaks connections on purpose,
 * chosen per connection by `policy(index)` (0 for the first connection).
 */
export async function startFaultProxy(target: string, policy: (index: number) => Fault): Promise<FaultProxy> {
  const { hostname, port } = new URL(target)
  const counts: Record<Fault, number> = { refuse: 0, cut: 0, pass: 0 }
  let index = 0
  let cutAnswers = 0

  const listener: TCPSocketListener<Pair> = Bun.listen<Pair>({
    hostname: '127.0.0.1',
    port: 0,
    socket: {
      open(client) {
        const fault = policy(index++)
        counts[fault] += 1
        const pair: Pair = { fault, pending: [], closed: false }
        client.data = pair
        if (fault === 'refuse') {
          client.end()
          return
        }
        void Bun.connect<undefined>({
          hostname,
          port: Number(port),
          socket: {
            data(_upstream, chunk) {
              if (pair.closed) return
              if (pair.fault === 'cut') {
                cutAnswers += 1
                client.write(chunk.subarray(0, CUT_AFTER_BYTES))
                pair.closed = true
                client.end()
                pair.upstream?.end()
                return
              }
              client.write(chunk)
            },
            close() {
              if (!pair.closed) client.end()
              pair.closed = true
            },
            error() {
              pair.closed = true
              client.end()
            },
          },
        }).then((upstream) => {
          pair.upstream = upstream
          if (pair.closed) return upstream.end()
          for (const chunk of pair.pending.splice(0)) upstream.write(chunk)
        }, () => client.end())
      },
      data(_client, chunk) {
        const pair = _client.data
        if (pair.upstream) pair.upstream.write(chunk)
        else pair.pending.push(new Uint8Array(chunk))
      },
      close(client) {
        client.data.closed = true
        client.data.upstream?.end()
      },
      error(client) {
        client.data.closed = true
        client.data.upstream?.end()
      },
    },
  })
  return {
    url: `http://127.0.0.1:${listener.port}`,
    counts,
    cutAnswers: () => cutAnswers,
    stop: () => listener.stop(true),
  }
}
