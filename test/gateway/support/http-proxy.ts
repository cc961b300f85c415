/**
 * A TCP proxy in front of an HTTP server, for the faults between the gateway
 * and its upstream (test/support/tcp-proxy.ts is the same idea for
 * PostgreSQL's protocol). It records the requests that pass (their request
 * line and header fields, as the upstream got them) and, per `mode`:
 *
 * - `pass`: forwards both ways;
 * - `cut`: forwards the request, and as soon as the upstream begins to answer
 *   (it has acted), resets the client's connection (RST): the answer is lost;
 * - `hold`: forwards the request and holds the answer back until `release()`
 *   (a slow upstream, the request in flight for as long as the test wants).
 */
import type { Socket } from 'bun'

export type ProxyMode = 'pass' | 'cut' | 'hold'

export interface SeenRequest {
  readonly method: string
  readonly target: string
  /** Lower-case names; a repeated field's values joined with ", ". */
  readonly headers: Readonly<Record<string, string>>
  /** The raw header block, as sent. */
  readonly raw: string
}

export interface HttpProxy {
  readonly url: string
  mode: ProxyMode
  /** Requests forwarded so far, in order. */
  readonly requests: readonly SeenRequest[]
  /** Answers cut so far (`cut`). */
  readonly cuts: number
  /** Answers held now (`hold`). */
  readonly held: number
  /** Lets every held answer through. */
  release(): void
  stop(): void
}

interface Pair {
  client: Socket<Pair>
  upstream?: Socket<undefined>
  toUpstream: Uint8Array[]
  /** Request bytes not yet parsed into a header block. */
  text: string
  heldBack: Uint8Array[]
  done: boolean
}

const REQUEST = /^([A-Z]+) (\S+) HTTP\/1\.[01]\r\n([\s\S]*?)\r\n\r\n/

export async function startHttpProxy(target: string): Promise<HttpProxy> {
  const to = new URL(target)
  const requests: SeenRequest[] = []
  const pairs = new Set<Pair>()
  let cuts = 0
  const decoder = new TextDecoder('latin1')

  /** Request header blocks, found in the client's bytes (the bodies here are small JSON, never a request line). */
  const parse = (pair: Pair) => {
    for (;;) {
      const start = pair.text.search(/[A-Z]+ \S+ HTTP\/1\.[01]\r\n/)
      if (start < 0) return
      const match = REQUEST.exec(pair.text.slice(start))
      if (!match) return
      const headers: Record<string, string> = {}
      for (const line of match[3]!.split('\r\n')) {
        const colon = line.indexOf(':')
        if (colon <= 0) continue
        const name = line.slice(0, colon).trim().toLowerCase()
        const value = line.slice(colon + 1).trim()
        headers[name] = headers[name] === undefined ? value : `${headers[name]}, ${value}`
      }
      requests.push({ method: match[1]!, target: match[2]!, headers, raw: match[3]! })
      pair.text = pair.text.slice(start + match[0].length)
    }
  }

  const proxy: HttpProxy = {
    url: '',
    mode: 'pass',
    get requests() { return requests },
    get cuts() { return cuts },
    get held() {
      let n = 0
      for (const pair of pairs) if (pair.heldBack.length > 0) n++
      return n
    },
    release() {
      for (const pair of pairs) {
        for (const chunk of pair.heldBack.splice(0)) pair.client.write(chunk)
      }
    },
    stop() {
      listener.stop(true)
      for (const pair of pairs) {
        pair.client.terminate()
        pair.upstream?.terminate()
      }
    },
  }

  const listener = Bun.listen<Pair>({
    hostname: '127.0.0.1',
    port: 0,
    socket: {
      open(client) {
        const pair: Pair = { client, toUpstream: [], text: '', heldBack: [], done: false }
        client.data = pair
        pairs.add(pair)
        void Bun.connect<undefined>({
          hostname: to.hostname,
          port: Number(to.port || 80),
          socket: {
            data(_upstream, chunk) {
              if (pair.done) return
              if (proxy.mode === 'cut') {
                // The upstream has answered: it acted. Its answer never reaches the client.
                cuts++
                pair.done = true
                pairs.delete(pair)
                pair.client.terminate()
                pair.upstream?.end()
                return
              }
              if (proxy.mode === 'hold' || pair.heldBack.length > 0) pair.heldBack.push(new Uint8Array(chunk))
              else pair.client.write(chunk)
            },
            close() { if (!pair.done && pair.heldBack.length === 0) { pair.done = true; pairs.delete(pair); pair.client.end() } },
            error() { if (!pair.done) { pair.done = true; pairs.delete(pair); pair.client.end() } },
          },
        }).then((upstream) => {
          pair.upstream = upstream
          if (pair.done) return void upstream.end()
          for (const chunk of pair.toUpstream.splice(0)) upstream.write(chunk)
        }, () => { pair.done = true; pairs.delete(pair); client.terminate() })
      },
      data(client, chunk) {
        const pair = client.data
        pair.text += decoder.decode(chunk)
        parse(pair)
        if (pair.upstream) pair.upstream.write(chunk)
        else pair.toUpstream.push(new Uint8Array(chunk))
      },
      close(client) {
        const pair = client.data
        if (pair.done) return
        pair.done = true
        pairs.delete(pair)
        pair.upstream?.end()
      },
      error(client) {
        client.data.done = true
        pairs.delete(client.data)
        client.data.upstream?.end()
      },
    },
  })
  ;(proxy as { url: string }).url = `http://127.0.0.1:${listener.port}`
  return proxy
}
