/**
 * An app of someone else's, on the installed package (test/package/package.test.ts
 * copies it out of the repository and installs the packed tarball next to it).
 * POST /emails sends an email once per Idempotency-Key; its side effect, the
 * outbox, is counted in memory and read at GET /outbox. An email to
 * hold@example.com waits until POST /outbox/release, so a retry can find it in
 * flight; one to a blocked address is a refusal of the app's own problem
 * catalogue, stored and replayed. Its keys past retention are purged.
 */
import { Type } from '@sinclair/typebox'
import { Elysia } from 'elysia'
import { bearerTenant, defineProblems, idempotentPost, migrate, openPools, problemResult, startRetentionPurge } from 'idempotent-post'

// No Node or Bun type packages here (tsconfig "types": []): the package's own types must not need them.
declare const process: { env: Record<string, string | undefined> }
const databaseUrl = process.env.DATABASE_URL
if (!databaseUrl) throw new Error('DATABASE_URL is not set')

const SendEmail = Type.Object({
  to: Type.String({ minLength: 3, maxLength: 254 }),
  subject: Type.String({ maxLength: 200 }),
}, { additionalProperties: false })

const MAIL_PROBLEMS = defineProblems({
  'recipient-blocked': { status: 422, title: 'Recipient blocked', detail: 'This address does not take our mail.' },
}, { typePrefix: 'urn:mailer:problem:' })

const outbox: { id: string; to: string; subject: string; idempotencyKey: string }[] = []
let release: () => void = () => undefined
let held = new Promise<void>((resolve) => { release = resolve })

await migrate(databaseUrl)
const pools = openPools(databaseUrl)
// Keys past the route's retention are deleted in the background (the test shortens the interval).
const retentionSeconds = 86_400
startRetentionPurge({ sql: pools.short, retentionSeconds, intervalMs: Number(process.env.PURGE_INTERVAL_MS ?? 60_000) })

const app = new Elysia()
  .use(idempotentPost({ pools, tenant: bearerTenant(new Map([['mail-key', 'mailer']])), ttlSeconds: 10, retentionSeconds }, {
    path: '/emails',
    body: SendEmail,
    problems: MAIL_PROBLEMS,
    async act({ body, idempotencyKey, signal }) {
      if (body.to === 'hold@example.com') await held
      signal.throwIfAborted()
      if (body.to.endsWith('@blocked.example')) return { sent: false as const }
      const email = { id: crypto.randomUUID(), to: body.to, subject: body.subject, idempotencyKey }
      outbox.push(email)
      return { sent: true as const, id: email.id }
    },
    async record({ result }) {
      if (!result.sent) return problemResult(MAIL_PROBLEMS.problem('recipient-blocked'))
      return { status: 202, body: { id: result.id, status: 'sent' } }
    },
  }))
  .get('/outbox', () => ({ sent: outbox.length, emails: outbox }))
  .post('/outbox/release', () => {
    release()
    held = new Promise<void>((resolve) => { release = resolve })
    return { released: true }
  })

// @ts-expect-error: the types the package ships are checked, not `any`: a TTL is a number.
idempotentPost({ pools, tenant: () => 't', ttlSeconds: 'thirty' }, { path: '/x', body: SendEmail, act: async () => 1, record: async () => ({ status: 201, body: {} }) })

app.listen({ hostname: '127.0.0.1', port: 0 })
console.log(`mailer listening on http://127.0.0.1:${app.server?.port}`)
