/**
 * TEST-ONLY BASELINE. The naive "check the key, then process, then save the
 * key" of the seed articles, on the same database and provider delay as the
 * product, so the storm tests can show that the storm breaks it: if this ever
 * stops producing duplicates, the storm is not exercising the race.
 */
import postgres from 'postgres'

export async function startNaiveServer(databaseUrl: string, providerDelayMs: number) {
  const sql = postgres(databaseUrl, { max: 20, onnotice: () => undefined })
  await sql`create table if not exists naive_keys (tenant text, key text, response text)` // no unique index: the naive version
  const server = Bun.serve({
    hostname: '127.0.0.1',
    port: 0,
    async fetch(request) {
      const key = request.headers.get('idempotency-key') ?? ''
      const body = (await request.json()) as { amount: number; currency: string; customer: string }
      const [seen] = await sql`select response from naive_keys where tenant = 'acme' and key = ${key}` // check
      if (seen) return new Response(seen.response, { status: 201 })
      await Bun.sleep(providerDelayMs) // process: the provider call
      const [row] = await sql`
        insert into payments (tenant, amount, currency, customer, status, provider_ref, idempotency_key)
        values ('acme', ${body.amount}, ${body.currency}, ${body.customer}, 'succeeded', 'naive', ${key}) returning id`
      const response = JSON.stringify({ id: row!.id })
      await sql`insert into naive_keys (tenant, key, response) values ('acme', ${key}, ${response})` // save the key
      return new Response(response, { status: 201 })
    },
  })
  return {
    url: `http://127.0.0.1:${server.port}`,
    async stop() {
      server.stop(true)
      await sql.end({ timeout: 1 })
    },
  }
}
