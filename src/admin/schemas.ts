/**
 * TypeBox schemas of every admin input: queries, forms and JSON bodies.
 * Elysia validates against them before a handler runs (a failure is a 400);
 * the handlers then pass the values to src/operations, which checks meaning
 * (a route's shape, a cursor's origin). Unknown query fields are dropped.
 */
import { t } from 'elysia'
import { MAX_CURSOR_LENGTH } from '../operations/cursor'
import { RELEASE_REASONS } from '../core/release'

/** Keys and tenants are stored as printable ASCII without spaces (the table's CHECK); so must any one we are asked to act on. */
export const Tenant = t.String({ pattern: '^[!-~]{1,64}$' })
export const Key = t.String({ pattern: '^[!-~]{1,255}$' })
/** A lease is a positive bigint in decimal. */
export const Lease = t.String({ pattern: '^[1-9][0-9]{0,18}$' })
export const AuditId = t.String({ pattern: '^[1-9][0-9]{0,18}$' })
/** A page size as typed in a query. */
const Limit = t.String({ pattern: '^[0-9]{1,4}$' })
/** Filters as typed: trimmed, blank meaning none, by src/operations. */
const Text = (maxLength: number) => t.String({ maxLength })
const Flag = t.Union([t.Literal('1'), t.Literal('0'), t.Literal('true'), t.Literal('false'), t.Literal('on'), t.Literal('')])

export const KeyFilterQuery = {
  tenant: t.Optional(Text(64)),
  route: t.Optional(Text(2100)),
  key: t.Optional(Text(255)),
  stale: t.Optional(Flag),
}

/** GET /admin/api/keys */
export const ApiKeysQuery = t.Object({ ...KeyFilterQuery, cursor: t.Optional(t.String({ maxLength: MAX_CURSOR_LENGTH })), limit: t.Optional(Limit) })
/** GET /admin/api/counts */
export const ApiCountsQuery = t.Object(KeyFilterQuery)
/** GET /admin (the list): also the page's cursor, the result to announce, and the auto-refresh switch. */
export const ListQuery = t.Object({
  ...KeyFilterQuery,
  after: t.Optional(t.String({ maxLength: MAX_CURSOR_LENGTH })),
  result: t.Optional(AuditId),
  refresh: t.Optional(t.Union([t.Literal('off'), t.Literal('on')])),
  /** Set by the page's own automatic reload: it does not count as the operator's activity (sessions.ts). */
  auto: t.Optional(t.Literal('1')),
})

export const AuditQuery = t.Object({
  actor: t.Optional(Text(128)),
  action: t.Optional(Text(64)),
  tenant: t.Optional(Text(64)),
  key: t.Optional(Text(255)),
  before: t.Optional(t.Union([AuditId, t.Literal('')])),
  limit: t.Optional(Limit),
})

export const KeyParams = t.Object({ tenant: Tenant, key: Key })
/** The detail of a key addressed by query (for keys a path cannot carry: "." and ".."). */
export const KeyQuery = t.Object({ tenant: Tenant, key: Key, result: t.Optional(AuditId), back: t.Optional(Text(2400)) })
export const KeyDetailQuery = t.Object({ result: t.Optional(AuditId), back: t.Optional(Text(2400)) })
export const AuditEntryParams = t.Object({ id: AuditId })

/** GET /admin/confirm/expire: the key and the lease the operator saw. */
export const ConfirmExpireQuery = t.Object({ tenant: Tenant, key: Key, lease: Lease, back: t.Optional(Text(2400)) })
export const ConfirmExpireStaleQuery = t.Object({ tenant: t.Optional(Text(64)) })

/** Every form carries this session's CSRF token. */
const Csrf = t.String({ minLength: 1, maxLength: 128 })
/** `note`: what the operator adds to the name their token gives, for the audit trail (never the actor by itself). */
export const SignInForm = t.Object({ token: t.String({ maxLength: 512 }), note: t.Optional(t.String({ maxLength: 128 })), next: t.Optional(t.String({ maxLength: 2048 })) })
export const SignInQuery = t.Object({ next: t.Optional(t.String({ maxLength: 2048 })) })
export const CsrfForm = t.Object({ csrf: t.Optional(Csrf) })
export const ExpireForm = t.Object({ csrf: t.Optional(Csrf), tenant: Tenant, key: Key, lease: Lease, back: t.Optional(Text(2400)) })
/** A session's public id (sessions.ts), a positive bigint in decimal. */
const SessionId = t.String({ pattern: '^[1-9][0-9]{0,18}$' })
export const EndSessionForm = t.Object({ csrf: t.Optional(Csrf), id: SessionId })
export const SessionsQuery = t.Object({ ended: t.Optional(SessionId) })
export const ExpireStaleForm = t.Object({ csrf: t.Optional(Csrf), as_of: t.String({ format: 'date-time' }), tenant: t.Optional(Text(64)) })

/** POST /admin/api/keys/expire: the lease as the list gave it (a string), or as a number JSON holds exactly (1e300 is an "integer" too, and was a 500). */
export const ApiExpireBody = t.Object({ tenant: Tenant, key: Key, lease: t.Union([Lease, t.Integer({ minimum: 1, maximum: Number.MAX_SAFE_INTEGER })]) })
export const ApiExpireStaleBody = t.Object({ as_of: t.Optional(t.String({ format: 'date-time' })), tenant: t.Optional(Text(64)) })
export const ApiPurgeBody = t.Object({})

/** GET /admin/released and /admin/api/released: keys released for one reason (default: after their deadline). */
export const ReleasedQuery = t.Object({
  // Every reason a release records (core/release.ts), the ones the counts report: one list, so the links of the page never 400.
  reason: t.Optional(t.Union(RELEASE_REASONS.map((reason) => t.Literal(reason)))),
  tenant: t.Optional(Text(64)),
  cursor: t.Optional(t.String({ maxLength: MAX_CURSOR_LENGTH })),
  limit: t.Optional(Limit),
})
/** GET /admin/runbooks/:alert: an alert name as the rules spell it. */
export const RunbookParams = t.Object({ alert: t.String({ pattern: '^[A-Za-z][A-Za-z0-9]{0,63}$' }) })
