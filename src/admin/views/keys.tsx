/** The list of keys in processing: counts under the filters, the filters, the keys, recent actions. */
import { visibleText } from '../../characters'
import { escapeHtml } from '@kitajs/html'
import type { KeyCounts } from '../../operations/count'
import { hasFilters, type KeyFilters } from '../../operations/filters'
import { formatAge, formatTime } from '../../operations/format'
import type { AuditRecord } from '../../operations/audit'
import type { ProcessingKey } from '../../operations/list'
import { Layout, type Operator } from '../layout'
import { auditHref, backOf, confirmExpireHref, confirmExpireStaleHref, keyHref, listHref } from '../links'
import { AuditTable, OutcomeNotice } from './audit'
import type { TenantHeld } from '../../http/tenant-refusals'

/** Every dynamic value is client- or operator-chosen: text goes through `safe`, attributes through escapeHtml. */

export interface KeysPageProps {
  readonly operator: Operator
  readonly counts: KeyCounts
  readonly ttlSeconds: number
  readonly filters: KeyFilters
  readonly keys: readonly ProcessingKey[]
  readonly firstPage: boolean
  readonly nextHref: string | undefined
  readonly notice: AuditRecord | undefined
  readonly audit: readonly AuditRecord[]
  /** The list as it is (filters and page), without the notice: what the auto-refresh reloads. */
  readonly selfHref: string
  /** Seconds between reloads, or undefined when the operator paused them. */
  readonly refreshSeconds: number | undefined
  /** Tenants this instance refused at their limits within the last minute, most refused first. */
  readonly held: readonly TenantHeld[]
}

export function KeysPage(props: KeysPageProps): JSX.Element {
  const { counts, filters, keys, operator } = props
  const scope = filters.tenant ? `tenant ${visibleText(filters.tenant)}` : 'all tenants'
  const filtered = hasFilters(filters)
  const back = backOf(filters)
  const refreshToggle = props.refreshSeconds === undefined
    ? <a href={escapeHtml(withParam(props.selfHref, 'refresh', 'on'))}>Resume auto-refresh</a>
    : <a href={escapeHtml(withParam(props.selfHref, 'refresh', 'off'))}>Pause auto-refresh</a>
  return (
    <Layout title={`${counts.stale} stale · admin`} operator={operator} refresh={props.refreshSeconds === undefined ? undefined : { seconds: props.refreshSeconds, url: withParam(props.selfHref, 'auto', '1') }}>
      {props.notice ? <OutcomeNotice entry={props.notice} /> : ''}
      <div class="counts" id="counts">
        <div class={counts.stale > 0 ? 'count alert' : 'count'}><b>{counts.stale}</b><span safe>{`stale (older than ${props.ttlSeconds}s), ${scope}`}</span></div>
        <div class="count"><b>{counts.processing}</b><span safe>{`in processing, ${scope}`}</span></div>
        <div class="count"><b safe>{counts.oldestProcessingAgeSeconds === null ? '-' : formatAge(counts.oldestProcessingAgeSeconds)}</b><span>oldest in processing</span></div>
        {filtered ? <div class="count"><b>{counts.matching}</b><span>match these filters</span></div> : ''}
        <div class="count"><b>{counts.expired}</b><span>past retention, to purge</span></div>
      </div>

      {props.held.length > 0 ? (
        <div class="notice" id="tenants-held">
          <b>Held at their limits</b> (this instance, the last minute; <code>http_tenant_refusals_total</code> for all):{' '}
          {props.held.map((held, i) => (
            <>{i > 0 ? ', ' : ''}<a href={escapeHtml(listHref({ ...filters, tenant: held.tenant, staleOnly: false }))} safe>{visibleText(held.tenant)}</a>{' '}
              <span safe>{`${held.refused.rate_limited} over the rate, ${held.refused.too_many_in_flight} over the in-flight cap`}</span></>
          ))}
        </div>
      ) : ''}
      <form class="filters" method="get" action="/admin/key" id="find-key">
        <label>Tenant<input type="text" name="tenant" required value={escapeHtml(filters.tenant ?? '')} /></label>
        <label>Idempotency-Key (exact)<input type="text" name="key" required /></label>
        <button type="submit">Find a key in any state</button>
      </form>
      <form class="filters" method="get" action="/admin">
        <label>Tenant<input type="text" name="tenant" value={escapeHtml(filters.tenant ?? '')} /></label>
        <label>Route (method path)<input type="text" name="route" placeholder="POST /api/payments" value={escapeHtml(filters.route ?? '')} /></label>
        <label>Key contains<input type="text" name="key" value={escapeHtml(filters.key ?? '')} /></label>
        <label class="check"><input type="checkbox" name="stale" value="1" checked={filters.staleOnly} /> stale only</label>
        {props.refreshSeconds === undefined ? <input type="hidden" name="refresh" value="off" /> : ''}
        <button type="submit">Filter</button>
        <a class="button" href="/admin">Clear</a>
      </form>
      <div class="bar">
        {counts.stale > 0 ? <a class="button" href={escapeHtml(confirmExpireStaleHref(filters.tenant))} safe>{`Expire all stale${filters.tenant ? ` of ${visibleText(filters.tenant)}` : ''}…`}</a> : ''}
        {counts.expired > 0 && !filtered ? <a class="button" href="/admin/confirm/purge">Purge expired…</a> : ''}
        <span class="muted">
          <span safe>{props.refreshSeconds === undefined ? 'Auto-refresh paused. ' : `Refreshes every ${props.refreshSeconds} s, keeping these filters and this page. `}</span>
          {refreshToggle}
        </span>
      </div>

      <h2>Keys in processing, stale first{props.firstPage ? '' : ' (continued)'}</h2>
      {keys.length === 0 ? (
        <p class="muted">No key in processing{filtered ? ' matches these filters' : ''}.</p>
      ) : (
        <table class="cards keys">
          <thead>
            <tr><th>State</th><th>Tenant</th><th>Key</th><th>Route</th><th>Age</th><th>Attempts</th><th>Lease</th><th></th></tr>
          </thead>
          <tbody>
            {keys.map((key) => <KeyRow entry={key} back={back} />)}
          </tbody>
        </table>
      )}
      <div class="pager">
        {props.firstPage ? '' : <a href={escapeHtml(listHref(filters))}>First page</a>}
        {props.nextHref ? <a href={escapeHtml(props.nextHref)}>Next page →</a> : ''}
      </div>
      <p class="muted">
        Open a key to see its owner process, its deadline and what a force-expire would do; every destructive action
        asks for confirmation first and shows exactly what it will do.
      </p>

      <h2>Recent operator actions{filters.tenant ? <> for tenant <span class="mono" safe>{visibleText(filters.tenant)}</span></> : ''}</h2>
      <AuditTable entries={props.audit} />
      <p><a href={escapeHtml(auditHref({ tenant: filters.tenant }))}>Whole audit trail →</a></p>
    </Layout>
  )
}

function KeyRow({ entry, back }: { entry: ProcessingKey; back: string | undefined }): JSX.Element {
  const detail = keyHref(entry.tenant, entry.key, { back })
  return (
    <tr class={entry.stale ? 'stale' : ''}>
      <td data-label="State">{entry.stale ? <span class="tag stale">stale</span> : entry.workedOn ? <span class="tag fresh">running</span> : <span class="tag stale" title="No live process works on it: its process is gone or its claim's answer was lost. A retry takes it over; it may be force-expired.">owner gone</span>}</td>
      <td data-label="Tenant" class="mono" safe>{visibleText(entry.tenant)}</td>
      <td data-label="Key" class="key"><a href={escapeHtml(detail)} safe>{visibleText(entry.key)}</a></td>
      <td data-label="Route" class="mono" safe>{visibleText(`${entry.method} ${entry.path}`)}</td>
      <td data-label="Age" class="num" title={escapeHtml(`lease taken ${formatTime(entry.lockedAt)}`)} safe>{formatAge(entry.ageSeconds)}</td>
      <td data-label="Attempts" class="num">{entry.attempts}</td>
      <td data-label="Lease" class="num mono" safe>{entry.lease}</td>
      <td class="actions">
        <a class="button" href={escapeHtml(detail)}>Details</a>{' '}
        <a class={entry.stale ? 'button danger' : 'button'} href={escapeHtml(confirmExpireHref(entry.tenant, entry.key, entry.lease, back))}>Force-expire…</a>
      </td>
    </tr>
  )
}

function withParam(href: string, name: string, value: string): string {
  const url = new URL(href, 'http://admin.invalid')
  url.searchParams.set(name, value)
  return `${url.pathname}${url.search}`
}

