/**
 * Keys released after their deadline (or another reason): the requests whose
 * provider call may have charged with nobody told yet, each with the
 * downstream key to ask the provider with (operations/released.ts).
 */
import { visibleText } from '../../characters'
import { escapeHtml } from '@kitajs/html'
import type { ReleaseReason } from '../../core/release'
import { formatTime } from '../../operations/format'
import type { ReleasedCounts, ReleasedKey } from '../../operations/released'
import { Layout, type Operator } from '../layout'
import { keyHref } from '../links'
import { summaryText } from './key-detail'

const TITLES: Record<ReleaseReason, string> = {
  deadline: 'Released after their deadline: the provider may have charged',
  shutdown: 'Released by a shutdown: the provider may have charged',
  failed: 'Released after a failure',
  lost_claim: 'Released after their claim\'s answer was lost (nothing ran)',
  force_expired: 'Force-expired by an operator: the provider may have charged',
}

export interface ReleasedPageProps {
  readonly operator: Operator
  readonly reason: ReleaseReason
  readonly tenant: string | undefined
  readonly keys: readonly ReleasedKey[]
  readonly counts: ReleasedCounts
  readonly nextHref: string | undefined
}

export function releasedHref(reason: ReleaseReason, extra: Record<string, string | undefined> = {}): string {
  const params = new URLSearchParams({ reason })
  for (const [name, value] of Object.entries(extra)) if (value) params.set(name, value)
  return `/admin/released?${params}`
}

export function ReleasedPage(props: ReleasedPageProps): JSX.Element {
  const { reason, counts } = props
  return (
    <Layout title={`${counts[reason]} ${reason} · admin`} operator={props.operator}>
      <h2 safe>{TITLES[reason]}</h2>
      <div class="counts" id="released-counts">
        {(['deadline', 'shutdown', 'force_expired', 'failed', 'lost_claim'] as const).map((each) => (
          <div class={each === reason ? 'count alert' : 'count'}><b>{counts[each]}</b><a href={escapeHtml(releasedHref(each, { tenant: props.tenant }))}>{each}</a></div>
        ))}
      </div>
      {reason === 'failed' || reason === 'lost_claim' ? '' : (
        <p class="muted">These requests were stopped while their provider call was in flight: it may still have gone through. The client's retry with the same key sends the same downstream key and gets that charge back, not a second one; until then nobody is told. Ask the provider with the downstream key (its charges by Idempotency-Key, or GET /v1/charges?customer=…) to learn whether it charged.</p>
      )}
      {props.keys.length === 0 ? <p id="released-none">No key is released for this reason now.</p> : (
        <table class="keys cards" id="released">
          <thead><tr><th>Released (UTC)</th><th>Tenant</th><th>Key</th><th>Request</th><th>Attempts</th><th>Downstream key</th></tr></thead>
          <tbody>
            {props.keys.map((key) => (
              <tr>
                <td data-label="Released" class="mono" safe>{`${formatTime(key.releasedAt)}${key.pastRetention ? ' (past retention)' : ''}`}</td>
                <td data-label="Tenant" class="mono" safe>{visibleText(key.tenant)}</td>
                <td data-label="Key" class="key"><a href={escapeHtml(keyHref(key.tenant, key.key))} safe>{visibleText(key.key)}</a></td>
                <td data-label="Request" safe>{key.summary ? summaryText(key.summary) : visibleText(`${key.method} ${key.path}`)}</td>
                <td data-label="Attempts" class="num">{key.attempts}</td>
                <td data-label="Downstream" class="mono" safe>{key.downstreamKey}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {props.nextHref ? <p class="pager"><a href={escapeHtml(props.nextHref)}>Older →</a></p> : ''}
    </Layout>
  )
}
