/// How a plugin is restarted when it exits (Erlang/OTP's child restart types).
public enum RestartPolicy: String, Sendable, CaseIterable {
    /// Always restarted, even after a clean exit.
    case permanent
    /// Restarted only after an abnormal exit (non-zero status, a signal, or a liveness kill).
    case transient
    /// Never restarted.
    case temporary
}

/// Tunables of one plugin's supervision. Every number is configurable per plugin.
public struct SupervisorPolicy: Equatable, Sendable {
    public var restart: RestartPolicy = .permanent
    /// First restart delay; doubles (×`backoffMultiplier`) per consecutive failure up to `backoffMaxMs`.
    public var backoffInitialMs: UInt64 = 200
    public var backoffMaxMs: UInt64 = 30_000
    public var backoffMultiplier: Double = 2
    /// Each delay is scaled by a random factor in [1 - jitter, 1 + jitter] (then capped).
    public var jitter: Double = 0.2
    /// Restart intensity: more than `maxRestarts` restarts within `intensityWindowMs` marks the
    /// plugin `failed` (not restarted again until `bus.restart`, or a reload that changes it).
    public var maxRestarts: Int = 5
    public var intensityWindowMs: UInt64 = 60_000
    /// After this much healthy uptime the consecutive-failure count (and backoff) resets.
    public var resetAfterMs: UInt64 = 30_000
    /// How long a started plugin has to complete its handshake.
    public var startTimeoutMs: UInt64 = 10_000
    /// Heartbeat period, and how long a heartbeat may go unanswered before the plugin is killed.
    /// 10 s: an idle plugin wakes 0.1 times a second for it (all plugins share one tick); a hung
    /// plugin is found within timeout + 2 × interval (30 s, the unit's WatchdogSec).
    public var heartbeatIntervalMs: UInt64 = 10_000
    public var heartbeatTimeoutMs: UInt64 = 10_000
    /// Grace period between asking a plugin to stop (`bus.shutdown`, channel closed) and SIGTERM.
    public var stopGraceMs: UInt64 = 5_000
    public init() {}

    /// Time a stopping plugin gets between SIGTERM and SIGKILL (not configurable: a process that
    /// outlives a second after SIGTERM is not shutting down).
    public static let termGraceMs: UInt64 = 1_000
    /// How long a plugin that closed its channel may take to exit by itself before it is killed,
    /// so a clean exit is reported with its real status (and 78 honoured), not as a liveness kill.
    public static let channelCloseGraceMs: UInt64 = 1_000
}
