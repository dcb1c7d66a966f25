import PylonCore
import PylonProtocol

#if canImport(Glibc)
import Glibc
#endif

/// The lifecycle of one supervised plugin as a value-type state machine: spawn, handshake
/// deadline, heartbeats, restarts with backoff and an intensity limit, and the stop sequence
/// (ask, SIGTERM, SIGKILL).
///
/// It performs no I/O and reads no clock. The host (`Bus+Supervision`) feeds it events with the
/// current loop time in ms and performs every returned `Action` in order, deciding nothing
/// itself. A phase that waits for something waits on exactly one timer, derived from the phase's
/// data (`timer`); each transition returns the cancel/arm actions that take the shell from the
/// old phase's timer to the new one's, so the shell's armed timers are always `timer`'s.
/// Tests drive it with a fake clock (PluginLifecycleTransitionTests).
public struct PluginLifecycle: Sendable {
    /// The timers the shell keeps for a plugin, one of each kind at most.
    public enum TimerKind: String, Sendable, CaseIterable {
        /// The handshake deadline (`startTimeoutMs` after the spawn).
        case handshake
        /// The heartbeat tick, repeating every `heartbeatIntervalMs` on aligned ticks.
        case heartbeat
        /// A plugin that closed its channel gets `channelCloseGraceMs` to exit by itself.
        case channelClose
        /// The end of a restart backoff.
        case backoff
        /// The next step of a requested stop (SIGTERM, then SIGKILL).
        case stop
    }

    /// One armed timer: fires at `at` (loop ms), then every `repeatMs` if non-zero.
    public struct Deadline: Equatable, Sendable {
        public var kind: TimerKind
        public var at: UInt64
        public var repeatMs: UInt64 = 0
    }

    /// Why a process that is still alive is on its way out.
    public enum ExitCause: Equatable, Sendable {
        /// It closed its channel; it is killed at `deadline` unless it exits by itself first
        /// (then its real exit status counts).
        case channelClosed(deadline: UInt64)
        /// It was killed for a liveness failure; the exit that follows is abnormal with `reason`.
        case killed(reason: String)
        /// It was killed for `bus.restart`; it is spawned again at once, free of the budget.
        case restartRequested
    }

    /// How far a requested stop has gone.
    public enum StopStep: Sendable {
        /// `bus.shutdown` sent and the channel closed; SIGTERM at the deadline.
        case asked
        /// SIGTERM sent; SIGKILL at the deadline.
        case terminated
        /// SIGKILL sent; the exit follows.
        case killed
    }

    /// Where the plugin is, with what each place needs to know.
    public enum Phase: Equatable, Sendable {
        /// No process, none wanted: not started yet, stopped on request, or a clean exit that
        /// the restart policy does not restart.
        case stopped
        /// `spawn` was returned; the shell answers with `spawned` or `spawnFailed` right away.
        case spawning
        /// Process `pid` runs; its handshake is due by `deadline`.
        case starting(pid: Int32, deadline: UInt64)
        /// Handshake completed at `since`; `heartbeatSentAt`: the unanswered heartbeat, if any.
        case running(pid: Int32, since: UInt64, heartbeatSentAt: UInt64?)
        /// Process `pid` still lives but is on its way out (`cause`). `since`: when it had
        /// become running, if it had (uptime and the failure-count decay use it).
        case exiting(pid: Int32, since: UInt64?, cause: ExitCause)
        /// Exited; spawned again at `until` (after `delayMs`).
        case backoff(until: UInt64, delayMs: UInt64)
        /// Given up on (intensity exceeded, exit status 78, or a policy that does not restart an
        /// abnormal exit) until `bus.restart` or a reload.
        case failed(reason: String)
        /// A requested stop of process `pid`: `step` taken, next step at `deadline` (none once
        /// SIGKILL was sent).
        case stopping(pid: Int32, step: StopStep, deadline: UInt64?)
    }

    /// A signal's purpose, for the log.
    public enum SignalCause: Equatable, Sendable {
        case noHandshake(timeoutMs: UInt64)
        case hung(waitedMs: UInt64)
        case channelClosed(graceMs: UInt64)
        case restartRequested
        case stopGraceExpired(graceMs: UInt64)
        case termIgnored(graceMs: UInt64)
    }

    /// What the shell performs, in the order returned.
    public enum Action: Equatable, Sendable {
        /// Start the process; answer with `spawned(pid:now:)` or `spawnFailed(now:error:)`.
        case spawn
        /// Start (or restart) the timer of this kind; when it fires, deliver `timerFired`.
        case armTimer(Deadline)
        case cancelTimer(TimerKind)
        /// Send `bus.heartbeat` with this reply timeout; deliver `heartbeatAnswered` on a result.
        case sendHeartbeat(timeoutMs: UInt64)
        /// Ask the process to exit: `bus.shutdown`, then close the channel once flushed.
        case sendShutdown
        /// Send `signal` to the process; an `exited` event follows (for SIGKILL, certainly).
        case signal(Int32, SignalCause)
        /// Publish `bus.plugin.exited`: a restart in `restartInMs`, or (nil) the plugin failed.
        case publishExited(pid: Int32, reason: String, restartInMs: UInt64?)
        /// The plugin left `starting` for the first time (running, or known to be failing):
        /// the host may now be ready.
        case reportReady
    }

    /// The states `bus.status`, routing and errors show (PROTOCOL.md): a summary of `phase`.
    public enum State: String, Sendable {
        case starting, running, backoff, failed, stopped
    }

    public let policy: SupervisorPolicy
    public private(set) var phase: Phase = .stopped
    /// Restarts performed in total (automatic and manual kills; not the first start).
    public private(set) var restarts = 0
    /// Failures since the last healthy period; drives the backoff exponent.
    public private(set) var consecutiveFailures = 0
    /// Times of recent automatic restarts, for the intensity limit.
    public private(set) var recentRestarts: [UInt64] = []
    public private(set) var lastExitReason: String?
    public private(set) var lastHeartbeatRttMs: UInt64?
    private var leftStarting = false
    private var rng: SplitMix64

    public init(policy: SupervisorPolicy, seed: UInt64 = 0x9E37_79B9_7F4A_7C15) {
        self.policy = policy
        rng = SplitMix64(seed: seed)
    }

    // MARK: Reading the phase

    public var state: State {
        switch phase {
        case .stopped, .stopping: return .stopped  // a stopping plugin is not routable
        case .spawning, .starting: return .starting
        case .running: return .running
        case .exiting(_, let since, _): return since == nil ? .starting : .running
        case .backoff: return .backoff
        case .failed: return .failed
        }
    }

    /// The live process, if there is one.
    public var pid: Int32? {
        switch phase {
        case .starting(let pid, _), .running(let pid, _, _), .exiting(let pid, _, _), .stopping(let pid, _, _): return pid
        case .stopped, .spawning, .backoff, .failed: return nil
        }
    }

    /// A process exists (or is being spawned): an `exited` event is still to come.
    public var isAlive: Bool {
        switch phase {
        case .spawning, .starting, .running, .exiting, .stopping: return true
        case .stopped, .backoff, .failed: return false
        }
    }

    /// When the current process completed its handshake.
    public var runningSince: UInt64? {
        switch phase {
        case .running(_, let since, _): return since
        case .exiting(_, let since, _): return since
        default: return nil
        }
    }

    public var failedReason: String? {
        if case .failed(let reason) = phase { return reason }
        return nil
    }

    /// The current backoff delay.
    public var backoffMs: UInt64? {
        if case .backoff(_, let ms) = phase { return ms }
        return nil
    }

    /// The coming exit was asked for (a stop or `bus.restart`): it is not a failure.
    public var exitIsRequested: Bool {
        switch phase {
        case .stopping, .exiting(_, _, .restartRequested): return true
        default: return false
        }
    }

    /// Has left `starting` at least once (running, or known to be failing), or was never started.
    public var hasLeftStarting: Bool { leftStarting || state != .starting }

    /// The timer `phase` waits on.
    public var timer: Deadline? { timer(of: phase) }

    private func timer(of phase: Phase) -> Deadline? {
        switch phase {
        case .starting(_, let deadline): return Deadline(kind: .handshake, at: deadline)
        case .running(_, let since, _):
            // Ticks aligned to multiples of the interval on the loop clock: plugins with the same
            // interval are pinged in the same loop turn, so an idle host wakes once per interval
            // rather than once per plugin (the first at least one full interval after `since`).
            let interval = max(1, policy.heartbeatIntervalMs)
            return Deadline(kind: .heartbeat, at: since + 2 * interval - since % interval, repeatMs: interval)
        case .exiting(_, _, .channelClosed(let deadline)): return Deadline(kind: .channelClose, at: deadline)
        case .backoff(let until, _): return Deadline(kind: .backoff, at: until)
        case .stopping(_, _, let deadline?): return Deadline(kind: .stop, at: deadline)
        case .stopped, .spawning, .exiting, .failed, .stopping: return nil
        }
    }

    // MARK: Events

    /// First start, or a manual start that clears `failed` or cuts a backoff short without
    /// spending the budget.
    public mutating func start(now: UInt64) -> [Action] {
        switch phase {
        case .stopped, .failed, .backoff:
            return settled(enter(.spawning) + [.spawn])
        case .spawning, .starting, .running, .exiting, .stopping:
            return []
        }
    }

    /// The process was spawned (after `.spawn`).
    public mutating func spawned(pid: Int32, now: UInt64) -> [Action] {
        guard phase == .spawning else { return [] }
        return settled(enter(.starting(pid: pid, deadline: now + policy.startTimeoutMs)))
    }

    /// `uv_spawn` failed (after `.spawn`): counts as an abnormal exit.
    public mutating func spawnFailed(now: UInt64, error: String) -> [Action] {
        guard phase == .spawning else { return [] }
        return settled(afterExit(now: now, pid: 0, since: nil, abnormal: true, reason: "spawn failed: \(error)", permanent: false))
    }

    /// `bus.hello` succeeded.
    public mutating func handshakeCompleted(now: UInt64) -> [Action] {
        guard case .starting(let pid, _) = phase else { return [] }
        return settled(enter(.running(pid: pid, since: now, heartbeatSentAt: nil)))
    }

    /// A heartbeat was answered with a result.
    public mutating func heartbeatAnswered(now: UInt64) -> [Action] {
        guard case .running(let pid, let since, let sentAt?) = phase else { return [] }
        lastHeartbeatRttMs = now >= sentAt ? now - sentAt : 0
        phase = .running(pid: pid, since: since, heartbeatSentAt: nil)
        return []
    }

    /// The plugin closed its bus channel while its process lives on.
    public mutating func channelClosed(now: UInt64) -> [Action] {
        let deadline = now + SupervisorPolicy.channelCloseGraceMs
        switch phase {
        case .starting(let pid, _):
            return settled(enter(.exiting(pid: pid, since: nil, cause: .channelClosed(deadline: deadline))))
        case .running(let pid, let since, _):
            return settled(enter(.exiting(pid: pid, since: since, cause: .channelClosed(deadline: deadline))))
        case .stopped, .spawning, .exiting, .backoff, .failed, .stopping:
            return []  // already on its way out (a stop closes the channel itself)
        }
    }

    /// The timer of `kind` fired. `lastInboundMs`: when the plugin last sent anything; a
    /// heartbeat tick judges silence by it, so a busy plugin still answering what was queued
    /// before the heartbeat is making progress and is not killed.
    public mutating func timerFired(_ kind: TimerKind, now: UInt64, lastInboundMs: UInt64 = 0) -> [Action] {
        switch (kind, phase) {
        case (.handshake, .starting(let pid, _)):
            return settled(
                kill(
                    pid: pid, since: nil, reason: "no handshake within \(policy.startTimeoutMs) ms",
                    .noHandshake(timeoutMs: policy.startTimeoutMs)))
        case (.heartbeat, .running(let pid, let since, .none)):
            phase = .running(pid: pid, since: since, heartbeatSentAt: now)
            return [.sendHeartbeat(timeoutMs: policy.heartbeatTimeoutMs + 2 * policy.heartbeatIntervalMs)]
        case (.heartbeat, .running(let pid, let since, let sentAt?)):
            // At most one heartbeat outstanding; hung means silent for the whole timeout.
            let lastSign = max(sentAt, lastInboundMs)
            guard now >= lastSign, now - lastSign >= policy.heartbeatTimeoutMs else { return [] }
            return settled(
                kill(
                    pid: pid, since: since, reason: "heartbeat not answered within \(policy.heartbeatTimeoutMs) ms",
                    .hung(waitedMs: now - sentAt)))
        case (.channelClose, .exiting(let pid, let since, .channelClosed)):
            return settled(
                kill(
                    pid: pid, since: since, reason: "bus channel closed",
                    .channelClosed(graceMs: SupervisorPolicy.channelCloseGraceMs)))
        case (.backoff, .backoff):
            recentRestarts.append(now)
            restarts += 1
            return settled(enter(.spawning) + [.spawn])
        case (.stop, .stopping(let pid, .asked, _)):
            return [.signal(SIGTERM, .stopGraceExpired(graceMs: policy.stopGraceMs))]
                + enter(.stopping(pid: pid, step: .terminated, deadline: now + SupervisorPolicy.termGraceMs))
        case (.stop, .stopping(let pid, .terminated, _)):
            return [.signal(SIGKILL, .termIgnored(graceMs: SupervisorPolicy.termGraceMs))]
                + enter(.stopping(pid: pid, step: .killed, deadline: nil))
        default:
            return []  // a timer of a phase already left
        }
    }

    /// The process exited with `status`, or was killed by `signal`.
    public mutating func exited(now: UInt64, status: Int64, signal: Int32) -> [Action] {
        let reason = signal != 0 ? "killed by signal \(signal)" : "exited with status \(status)"
        let abnormal = signal != 0 || status != 0
        let permanent = signal == 0 && status == Int64(exitStatusConfigError)
        switch phase {
        case .starting(let pid, _):
            return settled(afterExit(now: now, pid: pid, since: nil, abnormal: abnormal, reason: reason, permanent: permanent))
        case .running(let pid, let since, _):
            return settled(afterExit(now: now, pid: pid, since: since, abnormal: abnormal, reason: reason, permanent: permanent))
        case .exiting(let pid, let since, .channelClosed):
            // It exited by itself within the grace: its real status counts.
            return settled(afterExit(now: now, pid: pid, since: since, abnormal: abnormal, reason: reason, permanent: permanent))
        case .exiting(let pid, let since, .killed(let why)):
            return settled(afterExit(now: now, pid: pid, since: since, abnormal: true, reason: why, permanent: false))
        case .exiting(_, _, .restartRequested):
            // An operator's restart: immediate, and not charged to the automatic budget.
            lastExitReason = "restarted on request"
            restarts += 1
            return settled(enter(.spawning) + [.spawn])
        case .stopping:
            lastExitReason = reason
            return settled(enter(.stopped))
        case .stopped, .spawning, .backoff, .failed:
            return []
        }
    }

    /// A requested stop (shutdown, or a reload removed or replaced the plugin): `bus.shutdown`
    /// and EOF, SIGTERM after `stopGraceMs`, SIGKILL `termGraceMs` later. Ends in `stopped`.
    public mutating func stop(now: UInt64) -> [Action] {
        switch phase {
        case .starting(let pid, _), .running(let pid, _, _), .exiting(let pid, _, _):
            return settled(enter(.stopping(pid: pid, step: .asked, deadline: now + policy.stopGraceMs)) + [.sendShutdown])
        case .backoff, .failed:
            return settled(enter(.stopped))
        case .stopped, .spawning, .stopping:
            return []
        }
    }

    /// An operator asked for a restart (`bus.restart`): a live plugin is killed and spawned
    /// again as soon as its exit is reaped; a failed, stopped or backing-off one starts now.
    /// Neither spends the restart budget.
    public mutating func restartRequested(now: UInt64) -> [Action] {
        switch phase {
        case .starting(let pid, _):
            return settled(enter(.exiting(pid: pid, since: nil, cause: .restartRequested)) + [.signal(SIGKILL, .restartRequested)])
        case .running(let pid, let since, _):
            return settled(enter(.exiting(pid: pid, since: since, cause: .restartRequested)) + [.signal(SIGKILL, .restartRequested)])
        case .exiting(let pid, let since, .channelClosed):
            return settled(enter(.exiting(pid: pid, since: since, cause: .restartRequested)) + [.signal(SIGKILL, .restartRequested)])
        case .exiting(let pid, let since, .killed):
            return settled(enter(.exiting(pid: pid, since: since, cause: .restartRequested)))  // SIGKILL already sent
        case .stopped, .failed, .backoff:
            return start(now: now)
        case .spawning, .stopping, .exiting(_, _, .restartRequested):
            return []  // a stop wins over a restart
        }
    }

    // MARK: Transitions

    /// Moves to `next`, returning the timer actions that take the shell from the old phase's
    /// timer to the new one's.
    private mutating func enter(_ next: Phase) -> [Action] {
        let old = timer(of: phase)
        let new = timer(of: next)
        phase = next
        var out: [Action] = []
        if let old, old.kind != new?.kind { out.append(.cancelTimer(old.kind)) }
        if let new, new != old { out.append(.armTimer(new)) }
        return out
    }

    /// Liveness kill: SIGKILL now; the exit that follows is abnormal with `reason`.
    private mutating func kill(pid: Int32, since: UInt64?, reason: String, _ cause: SignalCause) -> [Action] {
        enter(.exiting(pid: pid, since: since, cause: .killed(reason: reason))) + [.signal(SIGKILL, cause)]
    }

    /// Appends `.reportReady` the first time the plugin leaves `starting`.
    private mutating func settled(_ actions: [Action]) -> [Action] {
        guard !leftStarting, state != .starting else { return actions }
        leftStarting = true
        return actions + [.reportReady]
    }

    private mutating func afterExit(
        now: UInt64, pid: Int32, since: UInt64?, abnormal: Bool, reason: String,
        permanent: Bool
    ) -> [Action] {
        lastExitReason = reason
        // Decay: a plugin that stayed healthy long enough starts its failure count afresh.
        if let since, now >= since, now - since >= policy.resetAfterMs {
            consecutiveFailures = 0
            recentRestarts.removeAll()
        }
        if permanent {
            return fail(pid: pid, "exited with status \(exitStatusConfigError) (configuration error): not restarted")
        }
        let restart: Bool
        switch policy.restart {
        case .permanent: restart = true
        case .transient: restart = abnormal
        case .temporary: restart = false
        }
        guard restart else {
            return abnormal ? fail(pid: pid, reason) : enter(.stopped)
        }
        // Intensity: at most maxRestarts within the window.
        let windowStart = now >= policy.intensityWindowMs ? now - policy.intensityWindowMs : 0
        recentRestarts.removeAll { $0 < windowStart }
        if recentRestarts.count >= policy.maxRestarts {
            return fail(
                pid: pid,
                "restart intensity exceeded: \(recentRestarts.count) restarts within \(policy.intensityWindowMs) ms; last: \(reason)")
        }
        consecutiveFailures += 1
        let delay = backoffDelay(failures: consecutiveFailures)
        return enter(.backoff(until: now + delay, delayMs: delay)) + [.publishExited(pid: pid, reason: reason, restartInMs: delay)]
    }

    private mutating func fail(pid: Int32, _ reason: String) -> [Action] {
        enter(.failed(reason: reason)) + [.publishExited(pid: pid, reason: reason, restartInMs: nil)]
    }

    /// Delay before the `failures`-th consecutive restart: exponential, capped, jittered.
    public mutating func backoffDelay(failures: Int) -> UInt64 {
        BackoffPolicy(
            initialMs: policy.backoffInitialMs, maxMs: policy.backoffMaxMs,
            multiplier: policy.backoffMultiplier, jitter: policy.jitter
        )
        .delay(attempt: failures, random: rng.nextUnit())
    }
}
