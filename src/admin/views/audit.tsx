/** The audit trail: a table, its filters, one entry, and the notice an action leaves. */
import { visibleJson, visibleText } from '../../characters'
import { escapeHtml } from '@kitajs/html'
import { AUDIT_ACTIONS } from '../../core/audit'
import type { AuditFilters, AuditRecord } from '../../operations/audit'
import { formatTime } from '../../operations/format'
import { Layout, type Operator } from '../layout'
import { auditEntryHref, auditHref, keyHref } from '../links'

export function AuditTable({ entries }: { entries: readonly AuditRecord[] }): JSX.Element {
  if (entries.length === 0) return <p class="muted">No operator action recorded yet.</p>
  return (
    <table class="cards audit">
      <thead>
        <tr><th>#</th><th>When (UTC)</th><th>Who</th><th>Action</th><th>Tenant</th><th>Key</th><th>Outcome</th></tr>
      </thead>
      <tbody>
        {entries.map((entry) => (
          <tr>
            <td data-label="Entry" class="num"><a href={escapeHtml(auditEntryHref(entry.id))} safe>{`#${entry.id}`}</a></td>
            <td data-label="When" class="mono" safe>{formatTime(entry.at)}</td>
            <td data-label="Who" safe>{visibleText(entry.actor)}</td>
            <td data-label="Action" safe>{describeAction(entry)}</td>
            <td data-label="Tenant" class="mono" safe>{visibleText(entry.tenant ?? '')}</td>
            <td data-label="Key" class="key" safe>{visibleText(entry.key ?? '')}</td>
            <td data-label="Outcome" safe>{entry.outcome}</td>
          </tr>
        ))}
      </tbody>
    </table>
  )
}

/** One line for an action, with its numbers. */
export function describeAction(entry: AuditRecord): string {
  const detail = entry.detail ?? {}
  if (entry.action === 'expire_all_stale') return `expire all stale (${Number(detail.expired ?? 0)} expired, ${Number(detail.worker_alive ?? 0)} alive)`
  if (entry.action === 'purge_expired') return `purge expired (${Number(detail.purged ?? 0)} deleted)`
  if (entry.action === 'force_expire') return detail.batch ? 'force-expire (expire all stale)' : 'force-expire'
  return entry.action
}

const OUTCOME_TEXT: Record<string, [tone: string, text: string]> = {
  expired: ['ok', 'Expired: the key was released. The client\'s next retry runs the request again, with the same downstream key, so a charge already made is returned, not made twice.'],
  worker_alive: ['warn', 'Not expired: a live worker holds this key and is still processing it, within its deadline. It will finish or fail on its own; fencing would stop it committing anyway if the key were taken.'],
  unchanged: ['warn', 'Nothing done: the key completed, was released or was taken over since you looked at it.'],
  none_stale: ['ok', 'Nothing to expire: no key was stale any more.'],
}

/** What an action just did, read back from its audit entry. */
export function OutcomeNotice({ entry }: { entry: AuditRecord }): JSX.Element {
  const link = <a href={escapeHtml(auditEntryHref(entry.id))} safe>{`audit entry #${entry.id}`}</a>
  if (entry.action === 'expire_all_stale') {
    const expired = Number(entry.detail?.expired ?? 0)
    const alive = Number(entry.detail?.worker_alive ?? 0)
    return (
      <div class={`notice ${alive > 0 ? 'warn' : 'ok'}`} role="status">
        <b>Expire all stale:</b> {expired} key(s) expired
        {alive > 0 ? `; ${alive} stale key(s) skipped because a live worker still holds them (still listed below)` : ''}. ({link})
      </div>
    )
  }
  if (entry.action === 'purge_expired') {
    return <div class="notice ok" role="status"><b>Purge:</b> {Number(entry.detail?.purged ?? 0)} key(s) past retention deleted. ({link})</div>
  }
  const [tone, text] = OUTCOME_TEXT[entry.outcome] ?? ['warn', `Outcome: ${entry.outcome}`]
  return (
    <div class={`notice ${tone}`} role="status">
      <b>Force-expire</b> of key <span class="mono" safe>{visibleText(entry.key ?? '')}</span> (tenant <span class="mono" safe>{visibleText(entry.tenant ?? '')}</span>):{' '}
      <span safe>{text}</span> ({link})
    </div>
  )
}

export function AuditPage(props: { operator: Operator; entries: readonly AuditRecord[]; filters: AuditFilters; nextHref: string | undefined }): JSX.Element {
  const { filters } = props
  return (
    <Layout title="Audit trail · admin" operator={props.operator}>
      <h2>Audit trail, newest first</h2>
      <form class="filters" method="get" action="/admin/audit">
        <label>Who (starts with)<input type="text" name="actor" placeholder="admin:alice, cli:" value={escapeHtml(filters.actor ?? '')} /></label>
        <label>Action
          <select name="action">
            <option value="">any</option>
            {AUDIT_ACTIONS.map((action) => <option value={action} selected={filters.action === action}>{action}</option>)}
          </select>
        </label>
        <label>Tenant<input type="text" name="tenant" value={escapeHtml(filters.tenant ?? '')} /></label>
        <label>Key (exact)<input type="text" name="key" value={escapeHtml(filters.key ?? '')} /></label>
        <button type="submit">Filter</button>
        <a class="button" href="/admin/audit">Clear</a>
      </form>
      <AuditTable entries={props.entries} />
      <div class="pager">{props.nextHref ? <a href={escapeHtml(props.nextHref)}>Older →</a> : ''}</div>
    </Layout>
  )
}

/** The entry's detail as indented JSON: it holds client-chosen keys, so it is escaped like any text. */
function detailText(entry: AuditRecord): string {
  return visibleJson(JSON.stringify(entry.detail ?? {}, null, 2))
}

export function AuditEntryPage({ operator, entry }: { operator: Operator; entry: AuditRecord }): JSX.Element {
  return (
    <Layout title={`Audit entry #${entry.id} · admin`} operator={operator}>
      <h2 safe>{`Audit entry #${entry.id}: ${describeAction(entry)}`}</h2>
      <dl class="facts">
        <dt>When (UTC)</dt><dd class="mono" safe>{formatTime(entry.at)}</dd>
        <dt>Who</dt><dd safe>{visibleText(entry.actor)}</dd>
        <dt>Action</dt><dd class="mono" safe>{entry.action}</dd>
        <dt>Tenant</dt><dd class="mono" safe>{visibleText(entry.tenant ?? '-')}</dd>
        <dt>Key</dt>
        <dd class="mono">{entry.tenant && entry.key ? <a href={escapeHtml(keyHref(entry.tenant, entry.key))} safe>{visibleText(entry.key)}</a> : '-'}</dd>
        <dt>Outcome</dt><dd class="mono" safe>{entry.outcome}</dd>
      </dl>
      <h2>Detail</h2>
      <pre safe>{detailText(entry)}</pre>
      <p class="bar">
        {entry.tenant && entry.key ? <a href={escapeHtml(auditHref({ tenant: entry.tenant, key: entry.key }))}>Every action on this key</a> : ''}
        {entry.tenant ? <a href={escapeHtml(auditHref({ tenant: entry.tenant }))} safe>{`Every action for tenant ${visibleText(entry.tenant)}`}</a> : ''}
        <a href="/admin/audit">Whole audit trail</a>
      </p>
    </Layout>
  )
}
