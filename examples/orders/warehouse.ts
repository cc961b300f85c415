/**
 * A fake warehouse, standing for any foreign HTTP service: it reserves stock,
 * and like any service worth calling it is idempotent by the Idempotency-Key
 * it is sent (the same key and request get the same reservation back).
 */
export interface Warehouse {
  readonly url: string
  /** Units left per SKU. */
  readonly stock: Map<string, number>
  /** Reservations made, by the key they were made under. */
  readonly reservations: Map<string, Reservation>
  stop(): void
}

export interface Reservation {
  readonly id: string
  readonly sku: string
  readonly quantity: number
}

export function startWarehouse(stock: Record<string, number>, port = 0): Warehouse {
  const units = new Map(Object.entries(stock))
  const reservations = new Map<string, Reservation>()
  const server = Bun.serve({
    hostname: '127.0.0.1',
    port,
    async fetch(request) {
      if (request.method !== 'POST' || new URL(request.url).pathname !== '/reservations') return new Response(null, { status: 404 })
      const key = request.headers.get('idempotency-key')
      if (!key) return new Response(null, { status: 400 })
      const { sku, quantity } = await request.json() as { sku: string; quantity: number }
      const seen = reservations.get(key)
      if (seen) return seen.sku === sku && seen.quantity === quantity ? Response.json(seen) : new Response(null, { status: 422 })
      const left = units.get(sku) ?? 0
      if (left < quantity) return Response.json({ error: 'out_of_stock', available: left }, { status: 409 })
      units.set(sku, left - quantity)
      const reservation = { id: `res_${crypto.randomUUID().slice(0, 8)}`, sku, quantity }
      reservations.set(key, reservation)
      return Response.json(reservation, { status: 201 })
    },
  })
  return { url: `http://127.0.0.1:${server.port}`, stock: units, reservations, stop: () => server.stop(true) }
}
