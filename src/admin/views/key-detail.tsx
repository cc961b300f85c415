/** One key: everything an operator weighs before clearing it. */
import { escapeHtml } from '@kitajs/html'
import type { AuditRecord } from '../../operations/audit'
import { formatAge, formatTime } from '../../operations/format'
import { ownerText, previewText } from '../../operations/describe'
import type { KeyDetail } from '../../operations/show'
import { Layout, type Operator } from '../layout'
import { auditHref, confirmExpireHref, listHref } from '../links'
import type { KeyFilters } from '../../operations/filters'
import { OutcomeNotice } from './audit'
import type { ReleaseReason } from '../../core/release'
import { visibleJson, visibleText } from '../../characters'
import { summaryText as plainSummary } from '../../operations/describe'
import { Exact } from './exact'

export interface KeyDetailPageProps {
  readonly operator: Operator
  readonly detail: KeyDetail
  readonly ttlSeconds: number
  readonly retentionSeconds: number
  readonly notice: AuditRecord | undefined
  /** The list the operator came from. */
  readonly back: KeyFilters | undefined
  readonly backQuery: string | undefined
}

const STATUS_TAG: Record<string, string> = { processing: 'fresh', done: 'ok', released: 'bad' }

/** Why the key was released, in words; "deadline" says what the operator must weigh. */
export const RELEASE_TEXT: Record<ReleaseReason, string> = {
  failed: 'its execution failed',
  deadline: 'after its deadline: the provider may have charged; a retry with this key gets that charge, or ask the provider with the downstream key',
  shutdown: 'stopped by a server shutdown: the provider may have charged',
  lost_claim: 'its claim\'s answer was lost: nothing ran under it',
  force_expired: 'force-expired by an operator (the audit trail says who): the provider may have charged',
}

/** The route's summary as `name value, name value`, shown by the one rule (characters.ts; rendered with `safe`). */
export function summaryText(summary: Readonly<Record<string, unknown>>): string {
  return visibleText(plainSummary(summary))
}

export function KeyDetailPage(props: KeyDetailPageProps): JSX.Element {
  const { detail } = props
  const time = (date: Date | null) => (date ? formatTime(date) : '-')
  return (
    <Layout title={`Key ${visibleText(detail.key)} · admin`} operator={props.operator}>
      {props.notice ? <OutcomeNotice entry={props.notice} /> : ''}
      <p><a href={escapeHtml(listHref(props.back ?? { tenant: detail.tenant, staleOnly: false }))}>← Back to the list</a></p>
      <h2>Key <span class="mono" safe>{visibleText(detail.key)}</span> of tenant <span class="mono" safe>{visibleText(detail.tenant)}</span></h2>
      <Exact value={detail.key} />
      <dl class="facts" id="key-facts">
        <dt>Status</dt>
        <dd>
          <span class={`tag ${detail.stale ? 'stale' : STATUS_TAG[detail.status] ?? 'fresh'}`}>{detail.stale ? 'processing, stale' : detail.status}</span>
        </dd>
        <dt>Request</dt><dd class="mono" safe>{visibleText(`${detail.method} ${detail.path}`)}</dd>
        <dt>Request summary</dt>
        <dd id="request-summary">
          {detail.payment
            ? <><span safe>{visibleText(`customer ${detail.payment.customer}, ${detail.payment.amount} ${detail.payment.currency} (minor units)`)}</span><Exact value={detail.payment.customer} /></>
            : detail.summary
              ? <><span safe>{summaryText(detail.summary)}</span><Exact value={detail.summary} /></>
              : detail.status === 'done'
                ? <span class="muted">Not kept once the request completed: a summary tells what a request in flight or released was.</span>
                : <span class="muted">None stored: the route keeps no summary, or the key was claimed before summaries were kept. The service keeps only the request's fingerprint.</span>}
        </dd>
        <dt>Fingerprint</dt><dd class="mono" safe>{detail.fingerprint}</dd>
        <dt>Attempts</dt><dd>{detail.attempts}{detail.attempts > 1 ? <span class="muted"> (re-run after a reclaim or a release: if its worker keeps dying, keep the key for the developers)</span> : ''}</dd>
        <dt>Lease</dt><dd class="mono" safe>{detail.lease}</dd>
        <dt>Lease taken</dt><dd class="mono" safe>{`${time(detail.lockedAt)} (${formatAge(detail.ageSeconds)} ago)`}</dd>
        {detail.deadline
          ? <><dt>Deadline</dt><dd class="mono" safe>{`${time(detail.deadline)} (lease + TTL ${props.ttlSeconds}s)${detail.stale ? ': passed, its worker has stopped' : ''}`}</dd></>
          : ''}
        <dt>Owner process</dt>
        <dd safe>{ownerText(detail)}</dd>
        <dt>Created</dt><dd class="mono" safe>{time(detail.createdAt)}</dd>
        {detail.completedAt ? <><dt>Completed</dt><dd class="mono" safe>{time(detail.completedAt)}</dd></> : ''}
        {detail.releasedAt ? <><dt>Released</dt><dd class="mono" safe>{`${time(detail.releasedAt)}${detail.releaseReason ? ` (${RELEASE_TEXT[detail.releaseReason]})` : ''}`}</dd></> : ''}
        {detail.retentionEndsAt
          ? <><dt>Replayed until</dt><dd class="mono" safe>{`${time(detail.retentionEndsAt)} (retention ${props.retentionSeconds}s)${detail.pastRetention ? ': passed, to purge' : ''}`}</dd></>
          : ''}
        <dt>Request id</dt>
        <dd><span class="mono" safe>{visibleText(detail.httpRequestId ?? '-')}</span><br /><span class="muted">The X-Request-Id of the request that last ran this key (the client's, or the one it was answered with): the <code>request_id</code> of its log lines.</span></dd>
        <dt>Execution id</dt><dd class="mono" safe>{detail.requestId}</dd>
        <dt>Downstream key</dt>
        <dd><span class="mono" safe>{detail.downstreamKey}</span><br /><span class="muted">The Idempotency-Key this request sends the payment provider, the same on every re-run: ask the provider about it to learn whether a charge was recorded.</span></dd>
      </dl>

      {detail.payment ? (
        <>
          <h2>Payment</h2>
          <dl class="facts">
            <dt>Id</dt><dd class="mono" safe>{detail.payment.id}</dd>
            <dt>Amount</dt><dd class="mono" safe>{`${detail.payment.amount} ${detail.payment.currency}`}</dd>
            <dt>Customer</dt><dd class="mono"><span safe>{visibleText(detail.payment.customer)}</span><Exact value={detail.payment.customer} /></dd>
            <dt>Provider charge</dt><dd class="mono" safe>{detail.payment.providerReference}</dd>
            <dt>Created</dt><dd class="mono" safe>{time(detail.payment.createdAt)}</dd>
          </dl>
        </>
      ) : ''}
      {detail.response ? (
        <>
          <h2 safe>{`Stored answer: ${detail.response.status}${detail.response.truncated ? ' (cut)' : ''}`}</h2>
          {/* The answer as stored, its invisible characters escaped as JSON escapes them (characters.ts visibleJson). */}
          <pre safe>{visibleJson(detail.response.body)}</pre>
        </>
      ) : ''}

      <h2>Force-expire</h2>
      <p safe>{previewText(detail)}</p>
      <p class="bar">
        {detail.expirePreview === 'not_processing' ? '' : (
          <a class={detail.expirePreview === 'expire' ? 'button danger' : 'button'} id="force-expire"
            href={escapeHtml(confirmExpireHref(detail.tenant, detail.key, detail.lease, props.backQuery))}>Force-expire…</a>
        )}
        <a href={escapeHtml(auditHref({ tenant: detail.tenant, key: detail.key }))}>Operator actions on this key</a>
      </p>
    </Layout>
  )
}
