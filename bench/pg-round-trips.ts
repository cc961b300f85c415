import type { Socket, TCPSocketListener } from 'bun'

/**
 * A TCP proxy between the service and PostgreSQL that reads the wire protocol
 * and counts, for all connections together:
 * - `statements`: Sync ('S') and simple Query ('Q') messages, one per statement sent;
 * - `roundTrips`: statements sent while that connection had no answer outstanding,
 *   i.e. times a connection had to wait for the server before going on.
 *   Statements pipelined behind an unanswered one are not a new round trip;
 * - `describes`: Flush ('H') messages, the extra Describe round trip postgres.js
 *   makes the first time a connection runs a statement (0 once warm).
 * Divide the change over N sequential requests by N to get the per-request cost.
 */
export interface RoundTripCounter {
  readonly url: string
  snapshot(): Counts
  stop(): void
}

export interface Counts {
  statements: number
  roundTrips: number
  describes: number
}

const SYNC = 0x53 // 'S'
const QUERY = 0x51 // 'Q'
const FLUSH = 0x48 // 'H'
const READY_FOR_QUERY = 0x5a // 'Z'

/** Walks a stream of protocol messages (type byte + Int32 length incl. itself), calling `onType` per message. */
class MessageScanner {
  private header = new Uint8Array(5)
  private filled = 0
  private skip = 0

  /** `untypedFirst`: the client's first message (StartupMessage) has a length but no type byte. */
  constructor(private untypedFirst: boolean, private readonly onType: (type: number) => void) {}

  feed(chunk: Uint8Array): void {
    let i = 0
    while (i < chunk.length) {
      if (this.skip > 0) {
        const n = Math.min(this.skip, chunk.length - i)
        this.skip -= n
        i += n
        continue
      }
      const headerSize = this.untypedFirst ? 4 : 5
      while (this.filled < headerSize && i < chunk.length) this.header[this.filled++] = chunk[i++]!
      if (this.filled < headerSize) return
      const offset = this.untypedFirst ? 0 : 1
      const view = new DataView(this.header.buffer)
      const length = view.getInt32(offset)
      if (!this.untypedFirst) this.onType(this.header[0]!)
      this.skip = length - 4
      this.filled = 0
      this.untypedFirst = false
    }
  }
}

export async function startRoundTripCounter(target: string): Promise<RoundTripCounter> {
  const { hostname, port } = new URL(target)
  const counts: Counts = { statements: 0, roundTrips: 0, describes: 0 }

  interface Link {
    upstream?: Socket<undefined>
    pending: Uint8Array[]
    /** Statements sent on this connection and not yet answered with ReadyForQuery. */
    outstanding: number
    fromClient: MessageScanner
    fromServer: MessageScanner
  }

  const listener: TCPSocketListener<Link> = Bun.listen<Link>({
    hostname: '127.0.0.1',
    port: 0,
    socket: {
      open(client) {
        // The startup exchange ends with one ReadyForQuery: count it as outstanding, not as a round trip.
        const link: Link = {
          pending: [],
          outstanding: 1,
          fromClient: new MessageScanner(true, (type) => {
            if (type === FLUSH) counts.describes += 1
            if (type !== SYNC && type !== QUERY) return
            counts.statements += 1
            if (link.outstanding === 0) counts.roundTrips += 1
            link.outstanding += 1
          }),
          fromServer: new MessageScanner(false, (type) => {
            if (type === READY_FOR_QUERY) link.outstanding = Math.max(0, link.outstanding - 1)
          }),
        }
        client.data = link
        void Bun.connect<undefined>({
          hostname,
          port: Number(port),
          socket: {
            data(_upstream, chunk) {
              link.fromServer.feed(chunk)
              client.write(chunk)
            },
            close: () => void client.end(),
            error: () => void client.end(),
          },
        }).then((upstream) => {
          link.upstream = upstream
          for (const chunk of link.pending.splice(0)) upstream.write(chunk)
        }, () => client.end())
      },
      data(client, chunk) {
        const link = client.data
        link.fromClient.feed(chunk)
        if (link.upstream) link.upstream.write(chunk)
        else link.pending.push(new Uint8Array(chunk))
      },
      close: (client) => void client.data.upstream?.end(),
      error: (client) => void client.data.upstream?.end(),
    },
  })
  const proxied = new URL(target)
  proxied.hostname = '127.0.0.1'
  proxied.port = String(listener.port)
  return {
    url: proxied.toString(),
    snapshot: () => ({ ...counts }),
    stop: () => listener.stop(true),
  }
}
