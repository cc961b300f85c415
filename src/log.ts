/**
 * Logs are data: one JSON object per line (pino's shape: `time`, `level`,
 * `msg`, then the fields), so an operator can grep a request id across every
 * line about that request, and a log pipeline can index them without a parser
 * of its own.
 *
 * Client-chosen strings (keys, paths, bodies) are hostile: JSON escapes quotes
 * and control characters, and we also escape everything outside printable
 * ASCII, so a key can neither break a line, forge a field, nor send escape
 * sequences to an operator's terminal.
 *
 * The level is chosen once, by LOG_LEVEL (debug, info, warn, error; @default info).
 */
import { unicodeEscape } from './characters'

export type LogLevel = 'debug' | 'info' | 'warn' | 'error'

/** Context carried by every line of a child logger (pino's `bindings`). */
export type LogFields = Readonly<Record<string, unknown>>

export interface Logger {
  debug(msg: string, fields?: LogFields): void
  info(msg: string, fields?: LogFields): void
  warn(msg: string, fields?: LogFields): void
  error(msg: string, fields?: LogFields): void
  /** A logger whose every line also carries `fields` (a request id, a tenant, a route). */
  child(fields: LogFields): Logger
}

const RANK: Record<LogLevel, number> = { debug: 10, info: 20, warn: 30, error: 40 }

/** Where lines go: stdout, so a container runtime or systemd collects one stream in order. */
export type LogSink = (line: string) => void

export interface LoggerOptions {
  readonly level?: LogLevel
  readonly sink?: LogSink
  /** Fields on every line (e.g. `{ pid }`, `{ component: 'provider-simulator' }`). */
  readonly base?: LogFields
  /** Tests pin the clock. @default new Date() */
  readonly now?: () => Date
}

export function parseLogLevel(raw: string | undefined): LogLevel | undefined {
  const value = raw?.trim().toLowerCase()
  return value === 'debug' || value === 'info' || value === 'warn' || value === 'error' ? value : undefined
}

const stdoutSink: LogSink = (line) => { process.stdout.write(line + '\n') }

export function createLogger(options: LoggerOptions = {}): Logger {
  const threshold = RANK[options.level ?? parseLogLevel(process.env.LOG_LEVEL) ?? 'info']
  const sink = options.sink ?? stdoutSink
  const now = options.now ?? (() => new Date())
  const make = (bound: LogFields): Logger => {
    const write = (level: LogLevel, msg: string, fields?: LogFields) => {
      if (RANK[level] < threshold) return
      sink(formatLine({ time: now().toISOString(), level, msg, ...bound, ...fields }))
    }
    return {
      debug: (msg, fields) => write('debug', msg, fields),
      info: (msg, fields) => write('info', msg, fields),
      warn: (msg, fields) => write('warn', msg, fields),
      error: (msg, fields) => write('error', msg, fields),
      child: (fields) => make({ ...bound, ...fields }),
    }
  }
  return make(options.base ?? {})
}

/** One JSON line, pure printable ASCII: anything else is a \u escape (characters.ts: a superset of what operators are shown escaped). */
export function formatLine(record: Record<string, unknown>): string {
  let text: string
  try {
    text = JSON.stringify(record, replacer)
  } catch {
    text = JSON.stringify({ time: record.time, level: record.level, msg: String(record.msg), unloggable: true })
  }
  return text.replace(/[^\x20-\x7e]/g, unicodeEscape)
}

/** Errors log their name, message and code (a SQLSTATE), never a stack that may hold a query's parameters. */
function replacer(_key: string, value: unknown): unknown {
  if (value instanceof Error) {
    const code = (value as { code?: unknown }).code
    return { name: value.name, message: value.message, ...(typeof code === 'string' ? { code } : {}) }
  }
  if (typeof value === 'bigint') return value.toString()
  return value
}

/** The error as a short string for a `msg` or a field. */
export function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error)
}

/** The process's logger. Modules take a Logger where they can (tests inject one), and fall back to this. */
export const log: Logger = createLogger({ base: { pid: process.pid } })
