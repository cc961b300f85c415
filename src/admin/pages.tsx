import { escapeHtml } from '@kitajs/html'
import type { AuditRecord } from '../core/audit'
import type { KeyCounts } from '../core/counts'
import type { ProcessingKey } from '../core/list-processing'
import { formatAge, formatTime } from './format'
import { Layout } from './layout'
import type { Filters } from './query'

/** Every dynamic value below is client- or operator-chosen: text goes through `safe`, attributes through escapeHtml. */

export function SignInPage({ error }: { error?: string | undefined }): JSX.Element {
  return (
    <Layout title="Sign in · admin">
      <form class="signin" method="post" action="/admin/login">
        <h2>Sign in</h2>
        {error ? <div class="notice bad" safe>{error}</div> : ''}
        <label>
          Admin token (ADMIN_TOKEN)
          <input type="password" name="token" autocomplete="current-password" required autofocus />
        </label>
        <label>
          Your name, for the audit trail
          <input type="text" name="name" autocomplete="username" maxlength="40" pattern="[A-Za-z0-9 ._@\-]{1,40}" placeholder="operator" />
        </label>
        <button type="submit">Sign in</button>
      </form>
    </Layout>
  )
}

export interface KeysPageProps {
  readonly operator: { name: string; csrf: string }
  readonly counts: KeyCounts
  readonly ttlSeconds: number
  readonly filters: Filters
  readonly keys: readonly ProcessingKey[]
  readonly firstPage: boolean
  readonly nextHref: string | undefined
  readonly notice: AuditRecord | undefined
  readonly audit: readonly AuditRecord[]
}

export function KeysPage(props: KeysPageProps): JSX.Element {
  const { counts, filters, keys, operator } = props
  const staleHref = `/admin/expire-stale${filters.tenant ? `?tenant=${encodeURIComponent(filters.tenant)}` : ''}`
  return (
    <Layout title={`${counts.stale} stale · admin`} operator={operator}>
      {props.notice ? <Notice entry={props.notice} /> : ''}
      <div class="counts">
        <div class={counts.stale > 0 ? 'count alert' : 'count'}><b>{counts.stale}</b><span>stale (older than {props.ttlSeconds}s)</span></div>
        <div class="count"><b>{counts.processing}</b><span>in processing</span></div>
        <div class="count"><b safe>{counts.oldestProcessingAgeSeconds === null ? '-' : formatAge(counts.oldestProcessingAgeSeconds)}</b><span>oldest in processing</span></div>
        <div class="count"><b>{counts.expired}</b><span>past retention, to purge</span></div>
      </div>

      <form class="filters" method="get" action="/admin">
        <label>Tenant<input type="text" name="tenant" value={escapeHtml(filters.tenant ?? '')} /></label>
        <label>Route (method path)<input type="text" name="route" placeholder="POST /api/payments" value={escapeHtml(filters.route ?? '')} /></label>
        <label class="check"><input type="checkbox" name="stale" value="1" checked={filters.staleOnly} /> stale only</label>
        <button type="submit">Filter</button>
        <a class="button" href="/admin">Clear</a>
        {counts.stale > 0 ? <a class="button" href={escapeHtml(staleHref)}>Expire all stale…</a> : ''}
      </form>

      <h2>Keys in processing, stale first{props.firstPage ? '' : ' (continued)'}</h2>
      {keys.length === 0 ? (
        <p class="muted">No key in processing{filters.tenant || filters.route || filters.staleOnly ? ' matches these filters' : ''}.</p>
      ) : (
        <table>
          <thead>
            <tr><th>State</th><th>Tenant</th><th>Key</th><th>Route</th><th>Age</th><th>Attempts</th><th>Lease</th><th></th></tr>
          </thead>
          <tbody>
            {keys.map((key) => <KeyRow entry={key} csrf={operator.csrf} />)}
          </tbody>
        </table>
      )}
      <div class="pager">
        {props.firstPage ? '' : <a href={escapeHtml(`/admin${filtersQuery(filters)}`)}>First page</a>}
        {props.nextHref ? <a href={escapeHtml(props.nextHref)}>Next page →</a> : ''}
      </div>
      <p class="muted">
        Force-expire deletes the key, so the client's next retry runs afresh. It is refused while a live worker still
        holds the key, and does nothing if the key changed since this page was loaded.
      </p>

      <h2>Recent operator actions</h2>
      <AuditTable entries={props.audit} />
      <p><a href="/admin/audit">Whole audit trail →</a></p>
    </Layout>
  )
}

function KeyRow({ entry, csrf }: { entry: ProcessingKey; csrf: string }): JSX.Element {
  return (
    <tr class={entry.stale ? 'stale' : ''}>
      <td>{entry.stale ? <span class="tag stale">stale</span> : <span class="tag fresh">running</span>}</td>
      <td class="mono" safe>{entry.tenant}</td>
      <td class="key" safe>{entry.key}</td>
      <td class="mono" safe>{`${entry.method} ${entry.path}`}</td>
      <td class="num" title={escapeHtml(`lease taken ${formatTime(entry.lockedAt)}`)} safe>{formatAge(entry.ageSeconds)}</td>
      <td class="num">{entry.attempts}</td>
      <td class="num mono" safe>{entry.lease}</td>
      <td>
        <form class="inline" method="post" action="/admin/keys/expire">
          <input type="hidden" name="csrf" value={escapeHtml(csrf)} />
          <input type="hidden" name="tenant" value={escapeHtml(entry.tenant)} />
          <input type="hidden" name="key" value={escapeHtml(entry.key)} />
          <input type="hidden" name="lease" value={escapeHtml(entry.lease)} />
          <button type="submit" class={entry.stale ? 'danger' : ''}>Force-expire</button>
        </form>
      </td>
    </tr>
  )
}

const OUTCOME_TEXT: Record<string, [tone: string, text: string]> = {
  expired: ['ok', 'Expired: the key was deleted; the next retry of this request runs afresh.'],
  worker_alive: ['warn', 'Not expired: a live worker holds this key and is still processing it. Its request will finish or fail on its own; fencing would stop it committing anyway if the key were taken.'],
  unchanged: ['warn', 'Nothing done: the key completed, was released or was taken over since the page was loaded.'],
  none_stale: ['ok', 'Nothing to expire: no key was stale any more.'],
}

function Notice({ entry }: { entry: AuditRecord }): JSX.Element {
  const [tone, text] = OUTCOME_TEXT[entry.outcome] ?? ['warn', `Outcome: ${entry.outcome}`]
  if (entry.action === 'expire_all_stale') {
    const expired = Number(entry.detail?.expired ?? 0)
    const alive = Number(entry.detail?.worker_alive ?? 0)
    return (
      <div class={`notice ${alive > 0 ? 'warn' : 'ok'}`}>
        <b>Expire all stale:</b> {expired} key(s) expired
        {alive > 0 ? `; ${alive} stale key(s) skipped because a live worker still holds them (listed below as still in processing)` : ''}.
      </div>
    )
  }
  return (
    <div class={`notice ${tone}`}>
      <b>Force-expire</b> of key <span class="mono" safe>{entry.key ?? ''}</span> (tenant <span class="mono" safe>{entry.tenant ?? ''}</span>):{' '}
      <span safe>{text}</span>
    </div>
  )
}

export function AuditTable({ entries }: { entries: readonly AuditRecord[] }): JSX.Element {
  if (entries.length === 0) return <p class="muted">No operator action recorded yet.</p>
  return (
    <table>
      <thead>
        <tr><th>When (UTC)</th><th>Who</th><th>Action</th><th>Tenant</th><th>Key</th><th>Outcome</th></tr>
      </thead>
      <tbody>
        {entries.map((entry) => (
          <tr>
            <td class="mono" safe>{formatTime(entry.at)}</td>
            <td safe>{entry.actor}</td>
            <td safe>{auditAction(entry)}</td>
            <td class="mono" safe>{entry.tenant ?? ''}</td>
            <td class="key" safe>{entry.key ?? ''}</td>
            <td safe>{entry.outcome}</td>
          </tr>
        ))}
      </tbody>
    </table>
  )
}

function auditAction(entry: AuditRecord): string {
  const detail = entry.detail ?? {}
  if (entry.action === 'expire_all_stale') return `expire all stale (${Number(detail.expired ?? 0)} expired, ${Number(detail.worker_alive ?? 0)} alive)`
  if (entry.action === 'purge_expired') return `purge expired (${Number(detail.purged ?? 0)} deleted)`
  if (entry.action === 'force_expire') return detail.batch ? 'force-expire (expire all stale)' : 'force-expire'
  return entry.action
}

export function AuditPage(props: { operator: { name: string; csrf: string }; entries: readonly AuditRecord[]; nextHref: string | undefined }): JSX.Element {
  return (
    <Layout title="Audit trail · admin" operator={props.operator}>
      <h2>Audit trail, newest first</h2>
      <AuditTable entries={props.entries} />
      <div class="pager">{props.nextHref ? <a href={escapeHtml(props.nextHref)}>Older →</a> : ''}</div>
    </Layout>
  )
}

export function ConfirmExpireStalePage(props: { operator: { name: string; csrf: string }; stale: number; asOf: Date; tenant: string | undefined; ttlSeconds: number }): JSX.Element {
  return (
    <Layout title="Expire all stale? · admin" operator={props.operator}>
      <h2>Expire all stale keys?</h2>
      <p>
        {props.stale} key(s) in processing {props.tenant ? <>for tenant <span class="mono" safe>{props.tenant}</span> </> : ''}
        were older than the TTL ({props.ttlSeconds}s) at <span class="mono" safe>{formatTime(props.asOf)}</span>.
      </p>
      <p>
        Each one is deleted, so its client's next retry runs afresh. Keys still held by a live worker are skipped and
        reported. Keys that completed or were taken over after this moment are left alone.
      </p>
      <form method="post" action="/admin/expire-stale">
        <input type="hidden" name="csrf" value={escapeHtml(props.operator.csrf)} />
        <input type="hidden" name="as_of" value={escapeHtml(props.asOf.toISOString())} />
        <input type="hidden" name="tenant" value={escapeHtml(props.tenant ?? '')} />
        <button type="submit" class="danger">Expire {props.stale} stale key(s)</button> <a class="button" href="/admin">Cancel</a>
      </form>
    </Layout>
  )
}

export function MessagePage({ title, message, operator }: { title: string; message: string; operator?: { name: string; csrf: string } | undefined }): JSX.Element {
  return (
    <Layout title={title} operator={operator}>
      <h2 safe>{title}</h2>
      <p safe>{message}</p>
      <p><a href="/admin">Back to the keys</a></p>
    </Layout>
  )
}

export function filtersQuery(filters: Filters): string {
  const params = new URLSearchParams()
  if (filters.tenant) params.set('tenant', filters.tenant)
  if (filters.route) params.set('route', filters.route)
  if (filters.staleOnly) params.set('stale', '1')
  const text = params.toString()
  return text ? `?${text}` : ''
}
