/** The alert runbooks (admin/runbooks.ts): the index, and one alert's section of docs/how-to/on-call.md. */
import { visibleText } from '../../characters'
import { escapeHtml } from '@kitajs/html'
import { Layout, type Operator } from '../layout'
import { runbookPath, type Runbook } from '../runbooks'

/** Public pages (admin/pages.ts): `operator` is undefined, and no session is looked up. */
export function RunbookIndexPage({ operator, runbooks, missing }: { operator: Operator | undefined; runbooks: readonly Runbook[]; missing?: string }): JSX.Element {
  return (
    <Layout title="Runbooks · admin" operator={operator}>
      <h2>Alert runbooks</h2>
      {missing !== undefined ? <p class="error" id="missing">No runbook for <code safe>{visibleText(missing)}</code>; these are the ones there are.</p> : ''}
      <p class="muted">One per alert of dashboards/prometheus-rules.yml and grafana-alerts.yml (their runbook_url points here), from docs/how-to/on-call.md.</p>
      <ul id="runbooks">
        {runbooks.map((runbook) => <li><a href={escapeHtml(runbookPath(runbook.alert))} safe>{runbook.alert}</a></li>)}
      </ul>
    </Layout>
  )
}

export function RunbookPage({ operator, runbook }: { operator: Operator | undefined; runbook: Runbook }): JSX.Element {
  // Rendered by admin/runbooks.ts with every raw tag escaped and every link kept on this origin.
  const safeSection = runbook.html
  return (
    <Layout title={`${runbook.alert} · runbook`} operator={operator}>
      <p><a href="/admin/runbooks">← All runbooks</a></p>
      <h2 id="runbook-title" safe>{`Runbook: ${runbook.alert}`}</h2>
      <article id="runbook" class="runbook">{safeSection}</article>
    </Layout>
  )
}
