import { collectDefaultMetrics, Gauge, type Registry } from 'prom-client'

/**
 * prom-client's default metrics that do NOT hold under Bun, measured with
 * prom-client 15.1 on Bun 1.4 (see docs/reference/metrics.md for the figures):
 * - process_heap_bytes, process_virtual_memory_bytes: VmData / VmSize of a Bun
 *   process are ~6.5 GB of reserved address space, not memory in use.
 * - nodejs_heap_space_size_*: JavaScriptCore has no V8 heap spaces; only "old" is
 *   filled in, with the whole heap.
 * - nodejs_active_handles*, nodejs_active_requests*, nodejs_active_resources*:
 *   always 0 with a listening server and a pending timer.
 * - nodejs_gc_duration_seconds: Bun emits no GC performance entries, so it
 *   never gets an observation.
 * - nodejs_version_info: reports Bun's Node-compatibility version, not Bun's.
 * Everything else (CPU seconds, RSS, open and max fds, start time, event-loop
 * lag and its percentiles, heap total/used, external memory) was checked
 * against /proc and a busy loop and is right.
 */
export const UNSUPPORTED_UNDER_BUN = [
  'process_heap_bytes',
  'process_virtual_memory_bytes',
  'nodejs_heap_space_size_total_bytes',
  'nodejs_heap_space_size_used_bytes',
  'nodejs_heap_space_size_available_bytes',
  'nodejs_active_handles',
  'nodejs_active_handles_total',
  'nodejs_active_requests',
  'nodejs_active_requests_total',
  'nodejs_active_resources',
  'nodejs_active_resources_total',
  'nodejs_gc_duration_seconds',
  'nodejs_version_info',
] as const

/** Registers the process metrics that are right under this runtime. */
export function collectProcessMetrics(registry: Registry): void {
  collectDefaultMetrics({ register: registry })
  if (typeof Bun === 'undefined') return
  for (const name of UNSUPPORTED_UNDER_BUN) registry.removeSingleMetric(name)
  registry.registerMetric(runtimeInfo())
}

/** Replaces nodejs_version_info, which would name the wrong runtime. */
function runtimeInfo(): Gauge<'version'> {
  const gauge = new Gauge({
    name: 'bun_version_info',
    help: 'The Bun version this process runs on (value is always 1).',
    labelNames: ['version'],
    registers: [],
    aggregator: 'first',
  })
  gauge.set({ version: Bun.version }, 1)
  return gauge
}
