import type { Socket } from 'bun'

/**
 * Writes to a Bun socket with backpressure, in order: what the socket does
 * not take now stays queued and goes out on its `drain` (call `flushQueued`
 * there). The bytes are copied, since the runtime may reuse a chunk it handed
 * us. Used by the test proxies (tcp-proxy.ts) and the bench's wire counter.
 */
export function sendQueued(socket: Socket<any> | undefined, queue: Uint8Array[], bytes: Uint8Array): void {
  if (bytes.length === 0) return
  queue.push(new Uint8Array(bytes))
  if (socket) flushQueued(socket, queue)
}

export function flushQueued(socket: Socket<any>, queue: Uint8Array[]): void {
  while (queue.length > 0) {
    const chunk = queue[0]!
    const written = socket.write(chunk)
    if (written < 0) return // closed
    if (written < chunk.length) {
      queue[0] = chunk.subarray(written)
      return
    }
    queue.shift()
  }
}
