import PylonCore

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
    /// 5 s: an idle install wakes rarely (all plugins share one tick); a hung plugin is found
    /// within timeout + interval.
    public var heartbeatIntervalMs: UInt64 = 5_000
    public var heartbeatTimeoutMs: UInt64 = 10_000
    /// Grace period between asking a plugin to stop (`bus.shutdown`, channel closed) and SIGKILL.
    public var stopGraceMs: UInt64 = 5_000
    public init() {}
}

/// Exit status a plugin uses to say "my configuration is wrong; do not restart me" (EX_CONFIG).
public let exitStatusPermanentFailure: Int64 = 78

/// The lifecycle of one supervised plugin as a value-type state machine. It performs no I/O and
/// reads no clock: the host feeds it events with the current time and performs the returned
/// `Action`. Tests drive it with a fake clock.
public struct PluginLifecycle: Sendable {
    public enum State: String, Sendable {
        case starting, running, backoff, failed, stopped
    }

    public enum Action: Equatable, Sendable {
        case none
        /// Start the process (and expect a handshake within `startTimeoutMs`).
        case spawn
        /// Send this signal to the running process; an `exited` event will follow.
        case kill(signal: Int32)
        /// Ask the process to exit (send `bus.shutdown`, close its channel); SIGKILL it if it
        /// is still alive after `graceMs`. An `exited` event will follow.
        case shutdown(graceMs: UInt64)
        /// Wait this long, then deliver `backoffElapsed`.
        case scheduleRestart(afterMs: UInt64)
        /// The plugin is given up on (restart intensity exceeded or permanent failure).
        case markFailed(reason: String)
    }

    public private(set) var state: State = .stopped
    public let policy: SupervisorPolicy
    /// Restarts performed in total (not counting the first start).
    public private(set) var restarts = 0
    /// Failures since the last healthy period; drives the backoff exponent.
    public private(set) var consecutiveFailures = 0
    /// Times of recent restarts, for the intensity limit.
    public private(set) var recentRestarts: [UInt64] = []
    public private(set) var runningSince: UInt64?
    public private(set) var lastExitReason: String?
    public private(set) var lastBackoffMs: UInt64 = 0
    public private(set) var failedReason: String?
    /// True while a liveness kill (hang, missed handshake) is pending; the exit that follows is abnormal.
    private var killedForLiveness = false
    private var manualRestart = false
    private var stopping = false
    private var processAlive = false
    private var rng: SplitMix64

    public init(policy: SupervisorPolicy, seed: UInt64 = 0x9E37_79B9_7F4A_7C15) {
        self.policy = policy
        rng = SplitMix64(seed: seed)
    }

    public var isAlive: Bool { processAlive }
    /// A requested stop is under way.
    public var isStopping: Bool { stopping }

    /// First start, or a manual (re)start that clears a `failed` state without spending the budget.
    public mutating func start(now: UInt64) -> Action {
        switch state {
        case .stopped, .failed, .backoff:
            state = .starting
            stopping = false
            failedReason = nil
            if !processAlive {
                processAlive = true
                return .spawn
            }
            return .none
        case .starting, .running:
            return .none
        }
    }

    /// `uv_spawn` failed: counts as an abnormal exit.
    public mutating func spawnFailed(now: UInt64, error: String) -> Action {
        processAlive = false
        return afterExit(now: now, abnormal: true, reason: "spawn failed: \(error)", permanent: false)
    }

    public mutating func handshakeCompleted(now: UInt64) -> Action {
        guard state == .starting else { return .none }
        state = .running
        runningSince = now
        return .none
    }

    /// The start deadline passed without a handshake.
    public mutating func handshakeTimedOut(now: UInt64) -> Action {
        guard state == .starting, processAlive else { return .none }
        killedForLiveness = true
        lastExitReason = "no handshake within \(policy.startTimeoutMs) ms"
        return .kill(signal: 9)
    }

    /// A heartbeat went unanswered past its deadline: the plugin is hung.
    public mutating func heartbeatMissed(now: UInt64) -> Action {
        guard state == .running, processAlive else { return .none }
        killedForLiveness = true
        lastExitReason = "heartbeat not answered within \(policy.heartbeatTimeoutMs) ms"
        return .kill(signal: 9)
    }

    /// The plugin closed its bus channel while its process lives on: treat it as dead.
    public mutating func channelClosed(now: UInt64) -> Action {
        guard processAlive, !stopping else { return .none }
        killedForLiveness = true
        lastExitReason = "bus channel closed"
        return .kill(signal: 9)
    }

    /// The process exited with `status` or was killed by `signal`.
    public mutating func exited(now: UInt64, status: Int64, signal: Int32) -> Action {
        processAlive = false
        let liveness = killedForLiveness
        killedForLiveness = false
        let reason: String
        if liveness, let r = lastExitReason {
            reason = r
        } else if signal != 0 {
            reason = "killed by signal \(signal)"
        } else {
            reason = "exited with status \(status)"
        }
        if stopping {
            state = .stopped
            lastExitReason = reason
            runningSince = nil
            return .none
        }
        if manualRestart {
            // An operator's restart: immediate, and not charged to the automatic budget.
            manualRestart = false
            lastExitReason = "restarted on request"
            runningSince = nil
            restarts += 1
            state = .starting
            processAlive = true
            return .spawn
        }
        let abnormal = liveness || signal != 0 || status != 0
        return afterExit(now: now, abnormal: abnormal, reason: reason,
                         permanent: !liveness && signal == 0 && status == exitStatusPermanentFailure)
    }

    private mutating func afterExit(now: UInt64, abnormal: Bool, reason: String, permanent: Bool) -> Action {
        lastExitReason = reason
        // Decay: a plugin that stayed healthy long enough starts its failure count afresh.
        if let since = runningSince, now >= since, now - since >= policy.resetAfterMs {
            consecutiveFailures = 0
            recentRestarts.removeAll()
        }
        runningSince = nil
        if permanent {
            return fail("exited with status \(exitStatusPermanentFailure) (configuration error): not restarted")
        }
        let restart: Bool
        switch policy.restart {
        case .permanent: restart = true
        case .transient: restart = abnormal
        case .temporary: restart = false
        }
        guard restart else {
            state = abnormal ? .failed : .stopped
            if abnormal { failedReason = reason }
            return abnormal ? .markFailed(reason: reason) : .none
        }
        // Intensity: at most maxRestarts within the window.
        let windowStart = now >= policy.intensityWindowMs ? now - policy.intensityWindowMs : 0
        recentRestarts.removeAll { $0 < windowStart }
        if recentRestarts.count >= policy.maxRestarts {
            return fail(
                "restart intensity exceeded: \(recentRestarts.count) restarts within \(policy.intensityWindowMs) ms; last: \(reason)"
            )
        }
        consecutiveFailures += 1
        let delay = backoffDelay(failures: consecutiveFailures)
        lastBackoffMs = delay
        state = .backoff
        return .scheduleRestart(afterMs: delay)
    }

    private mutating func fail(_ reason: String) -> Action {
        state = .failed
        failedReason = reason
        return .markFailed(reason: reason)
    }

    /// The backoff delay has passed.
    public mutating func backoffElapsed(now: UInt64) -> Action {
        guard state == .backoff else { return .none }
        recentRestarts.append(now)
        restarts += 1
        state = .starting
        processAlive = true
        return .spawn
    }

    /// A requested stop (shutdown, reload removed it). The process is asked to exit.
    public mutating func stop(now: UInt64) -> Action {
        stopping = true
        if processAlive {
            return .shutdown(graceMs: policy.stopGraceMs)
        }
        state = .stopped
        return .none
    }

    /// An operator asked for a restart (`bus.restart`): a running plugin is killed and started
    /// again at once; a failed or backing-off one starts now. Neither spends the restart budget.
    public mutating func restartRequested(now: UInt64) -> Action {
        if processAlive {
            manualRestart = true
            return .kill(signal: 9)
        }
        return start(now: now)
    }

    /// Delay before the `failures`-th consecutive restart: exponential, capped, jittered.
    public mutating func backoffDelay(failures: Int) -> UInt64 {
        BackoffPolicy(initialMs: policy.backoffInitialMs, maxMs: policy.backoffMaxMs,
                      multiplier: policy.backoffMultiplier, jitter: policy.jitter)
            .delay(attempt: failures, random: rng.nextUnit())
    }
}
