import Glibc
import PylonCore
import PylonProtocol
import Testing

@testable import PylonHost

/// The shell of a plugin's lifecycle in miniature, on a fake clock: it keeps the timers the
/// machine arms and fires them when the clock passes them, answers `spawn` with a pid (or a
/// failure), and records every action. After each event it checks what the real shell relies
/// on: the armed timers are exactly the phase's timer.
struct FakeShell {
    typealias Action = PluginLifecycle.Action
    var life: PluginLifecycle
    private(set) var now: UInt64 = 0
    private(set) var armed: [PluginLifecycle.TimerKind: PluginLifecycle.Deadline] = [:]
    /// Every action performed, in order.
    private(set) var performed: [Action] = []
    var nextPid: Int32 = 100
    /// When set, the next spawn fails with this error.
    var spawnError: String?
    /// When the plugin last sent anything (heartbeat ticks judge silence by it).
    var lastInboundMs: UInt64 = 0

    init(_ policy: SupervisorPolicy, now: UInt64 = 0) {
        life = PluginLifecycle(policy: policy)
        self.now = now
    }

    /// Delivers one event and performs its actions; returns them (nested spawn answers included).
    @discardableResult
    mutating func send(
        _ event: (inout PluginLifecycle, UInt64) -> [Action],
        sourceLocation: SourceLocation = #_sourceLocation
    ) -> [Action] {
        let out = perform(event(&life, now))
        checkTimers(sourceLocation)
        return out
    }

    private mutating func perform(_ actions: [Action]) -> [Action] {
        var out: [Action] = []
        for a in actions {
            out.append(a)
            performed.append(a)
            switch a {
            case .armTimer(let d): armed[d.kind] = d
            case .cancelTimer(let k): armed[k] = nil
            case .spawn:
                if let e = spawnError {
                    spawnError = nil
                    out += perform(life.spawnFailed(now: now, error: e))
                } else {
                    nextPid += 1
                    out += perform(life.spawned(pid: nextPid, now: now))
                }
            default: break
            }
        }
        return out
    }

    /// Moves the clock forward by `ms`, firing due timers in order; returns the actions they caused.
    @discardableResult
    mutating func advance(_ ms: UInt64, sourceLocation: SourceLocation = #_sourceLocation) -> [Action] {
        let end = now + ms
        var out: [Action] = []
        while let next = armed.values.filter({ $0.at <= end }).min(by: { $0.at < $1.at }) {
            now = next.at
            if next.repeatMs > 0 {
                armed[next.kind]!.at += next.repeatMs
            } else {
                armed[next.kind] = nil
            }
            let inbound = lastInboundMs
            out += perform(life.timerFired(next.kind, now: now, lastInboundMs: inbound))
            checkTimers(sourceLocation)
        }
        now = end
        return out
    }

    private func checkTimers(_ loc: SourceLocation) {
        #expect(
            Set(armed.keys) == Set([life.timer?.kind].compactMap { $0 }),
            "armed timers \(armed.keys.map(\.rawValue)) vs phase \(life.phase)", sourceLocation: loc)
        if let t = life.timer, t.repeatMs == 0 {
            #expect(armed[t.kind] == t, sourceLocation: loc)
        }
    }

    // Shortcuts for the events the host delivers (failures are reported at the caller's line).
    typealias Loc = SourceLocation
    @discardableResult mutating func start(_ l: Loc = #_sourceLocation) -> [Action] { send({ $0.start(now: $1) }, sourceLocation: l) }
    @discardableResult mutating func hello(_ l: Loc = #_sourceLocation) -> [Action] {
        send({ $0.handshakeCompleted(now: $1) }, sourceLocation: l)
    }
    @discardableResult mutating func exit(status: Int64 = 0, signal: Int32 = 0, _ l: Loc = #_sourceLocation) -> [Action] {
        send({ $0.exited(now: $1, status: status, signal: signal) }, sourceLocation: l)
    }
    @discardableResult mutating func stop(_ l: Loc = #_sourceLocation) -> [Action] { send({ $0.stop(now: $1) }, sourceLocation: l) }
    @discardableResult mutating func restart(_ l: Loc = #_sourceLocation) -> [Action] {
        send({ $0.restartRequested(now: $1) }, sourceLocation: l)
    }
    @discardableResult mutating func closeChannel(_ l: Loc = #_sourceLocation) -> [Action] {
        send({ $0.channelClosed(now: $1) }, sourceLocation: l)
    }
    @discardableResult mutating func answerHeartbeat(_ l: Loc = #_sourceLocation) -> [Action] {
        send({ $0.heartbeatAnswered(now: $1) }, sourceLocation: l)
    }
}

/// Every transition of `PluginLifecycle`, with the exact actions it returns, on a fake clock.
struct PluginLifecycleTransitionTests {
    typealias Deadline = PluginLifecycle.Deadline

    func policy(_ f: (inout SupervisorPolicy) -> Void = { _ in }) -> SupervisorPolicy {
        var p = SupervisorPolicy()
        p.backoffInitialMs = 100
        p.backoffMaxMs = 1_000
        p.jitter = 0
        p.maxRestarts = 3
        p.intensityWindowMs = 10_000
        p.startTimeoutMs = 2_000
        p.heartbeatIntervalMs = 1_000
        p.heartbeatTimeoutMs = 3_000
        p.stopGraceMs = 500
        f(&p)
        return p
    }

    /// A shell whose plugin is running (handshake at 250 ms).
    func running(_ p: SupervisorPolicy? = nil) -> FakeShell {
        var s = FakeShell(p ?? policy())
        s.start()
        s.advance(250)
        s.hello()
        #expect(s.life.state == .running)
        return s
    }

    // MARK: Start and handshake

    @Test func startSpawnsAndArmsTheHandshakeDeadline() {
        var s = FakeShell(policy(), now: 1_000)
        #expect(s.life.phase == .stopped)
        #expect(s.start() == [.spawn, .armTimer(Deadline(kind: .handshake, at: 3_000))])
        #expect(s.life.phase == .starting(pid: 101, deadline: 3_000))
        #expect(s.life.state == .starting)
        #expect(s.life.pid == 101)
        #expect(s.start() == [], "starting twice does nothing")
    }

    @Test func handshakeCancelsTheDeadlineArmsAlignedHeartbeatsAndReportsReadyOnce() {
        var s = FakeShell(policy())
        s.start()
        s.advance(250)
        // Interval 1000: the first tick is at least one full interval away, on a multiple of it.
        #expect(
            s.hello() == [
                .cancelTimer(.handshake), .armTimer(Deadline(kind: .heartbeat, at: 2_000, repeatMs: 1_000)),
                .reportReady,
            ])
        #expect(s.life.phase == .running(pid: 101, since: 250, heartbeatSentAt: nil))
        #expect(s.life.runningSince == 250)
        #expect(s.hello() == [], "a second hello changes nothing")
        // After a crash and restart the host is not told again.
        s.exit(status: 1)
        s.advance(100)
        #expect(!s.hello().contains(.reportReady))
    }

    @Test func heartbeatTicksOfPluginsStartedApartShareALoopTurn() {
        var a = FakeShell(policy(), now: 10_100)
        var b = FakeShell(policy(), now: 10_900)
        a.start(); a.hello()
        b.start(); b.hello()
        #expect(a.life.timer?.at == 12_000)
        #expect(a.life.timer == b.life.timer)
    }

    @Test func missedHandshakeKillsAndTheExitIsAbnormal() {
        var s = FakeShell(policy { $0.restart = .transient })
        s.start()
        #expect(s.advance(2_000) == [.cancelTimer(.handshake), .signal(SIGKILL, .noHandshake(timeoutMs: 2_000))])
        #expect(s.life.phase == .exiting(pid: 101, since: nil, cause: .killed(reason: "no handshake within 2000 ms")))
        #expect(s.life.state == .starting)
        #expect(s.life.hasLeftStarting == false, "readiness waits for the exit")
        // Even a clean status after a liveness kill is a failure that transient restarts.
        #expect(
            s.exit(status: 0) == [
                .armTimer(Deadline(kind: .backoff, at: 2_100)),
                .publishExited(pid: 101, reason: "no handshake within 2000 ms", restartInMs: 100),
                .reportReady,
            ])
    }

    @Test func spawnFailureIsAnAbnormalExitWithPidZero() {
        var s = FakeShell(policy())
        s.spawnError = "ENOENT"
        #expect(
            s.start() == [
                .spawn, .armTimer(Deadline(kind: .backoff, at: 100)),
                .publishExited(pid: 0, reason: "spawn failed: ENOENT", restartInMs: 100), .reportReady,
            ])
        #expect(s.life.phase == .backoff(until: 100, delayMs: 100))
        #expect(s.life.backoffMs == 100)
        #expect(s.life.isAlive == false)
        // The next attempt spawns.
        #expect(s.advance(100) == [.cancelTimer(.backoff), .spawn, .armTimer(Deadline(kind: .handshake, at: 2_100))])
        #expect(s.life.restarts == 1)
    }

    @Test func spawnOutcomesOutsideSpawningAreIgnored() {
        var s = running()
        #expect(s.send { $0.spawned(pid: 7, now: $1) } == [])
        #expect(s.send { $0.spawnFailed(now: $1, error: "x") } == [])
        #expect(s.life.pid == 101)
    }

    // MARK: Heartbeats

    @Test func heartbeatIsSentOnTheTickAndItsAnswerRecordsTheRoundTrip() {
        var s = running()
        #expect(s.advance(1_750) == [.sendHeartbeat(timeoutMs: 3_000 + 2 * 1_000)])  // tick at 2000
        #expect(s.life.phase == .running(pid: 101, since: 250, heartbeatSentAt: 2_000))
        s.advance(30)
        #expect(s.answerHeartbeat() == [])
        #expect(s.life.lastHeartbeatRttMs == 30)
        #expect(s.life.phase == .running(pid: 101, since: 250, heartbeatSentAt: nil))
        #expect(s.answerHeartbeat() == [], "an answer with none outstanding is ignored")
        #expect(s.advance(970) == [.sendHeartbeat(timeoutMs: 5_000)], "the next tick sends the next one")
    }

    @Test func aSilentPluginIsKilledOnTheFirstTickPastTheTimeout() {
        var s = running()
        s.advance(1_750)  // heartbeat sent at 2000
        #expect(s.advance(2_999) == [], "ticks at 3000, 4000 (silent 2 s) keep waiting")
        #expect(s.advance(1) == [.cancelTimer(.heartbeat), .signal(SIGKILL, .hung(waitedMs: 3_000))])  // tick at 5000
        #expect(
            s.life.phase
                == .exiting(
                    pid: 101, since: 250,
                    cause: .killed(reason: "heartbeat not answered within 3000 ms")))
        #expect(s.life.state == .running, "still shown running until the exit is reaped")
        #expect(
            s.exit(signal: 9).contains(
                .publishExited(
                    pid: 101, reason: "heartbeat not answered within 3000 ms",
                    restartInMs: 100)))
    }

    @Test func aBusyPluginStillSendingIsNotKilled() {
        var s = running()
        s.advance(1_750)  // heartbeat sent at 2000, never answered
        for t in stride(from: UInt64(3_000), through: 9_000, by: 1_000) {
            s.lastInboundMs = t - 500  // answering other requests
            #expect(s.advance(1_000) == [])
        }
        // Falls silent after 8500: killed at the first tick 3 s later (12000).
        #expect(s.advance(2_000) == [])
        #expect(s.advance(1_000).contains(.signal(SIGKILL, .hung(waitedMs: 10_000))))
    }

    // MARK: Channel closed

    @Test func channelClosedGivesAGraceThenKills() {
        var s = running()
        s.advance(50)  // 300
        #expect(
            s.closeChannel() == [
                .cancelTimer(.heartbeat),
                .armTimer(Deadline(kind: .channelClose, at: 300 + SupervisorPolicy.channelCloseGraceMs)),
            ])
        #expect(s.life.state == .running, "PROTOCOL.md: running while a plugin that closed its channel has not exited")
        #expect(s.closeChannel() == [])
        #expect(
            s.advance(SupervisorPolicy.channelCloseGraceMs) == [
                .cancelTimer(.channelClose), .signal(SIGKILL, .channelClosed(graceMs: SupervisorPolicy.channelCloseGraceMs)),
            ])
        #expect(s.exit(signal: 9).contains(.publishExited(pid: 101, reason: "bus channel closed", restartInMs: 100)))
    }

    @Test func anExitWithinTheChannelGraceKeepsItsRealStatus() {
        var s = running(policy { $0.restart = .transient })
        s.closeChannel()
        s.advance(10)
        #expect(s.exit(status: 0) == [.cancelTimer(.channelClose)], "a clean exit: stopped, nothing published")
        #expect(s.life.phase == .stopped)
        var s78 = running()
        s78.closeChannel()
        #expect(
            s78.exit(status: Int64(exitStatusConfigError)).contains(
                .publishExited(pid: 101, reason: "exited with status 78 (configuration error): not restarted", restartInMs: nil)))
        #expect(s78.life.state == .failed)
    }

    @Test func channelClosedWhileStartingStillShowsStarting() {
        var s = FakeShell(policy())
        s.start()
        #expect(s.closeChannel() == [.cancelTimer(.handshake), .armTimer(Deadline(kind: .channelClose, at: 1_000))])
        #expect(s.life.state == .starting)
    }

    // MARK: Exits and restarts

    @Test func crashBacksOffThenSpawnsAgain() {
        var s = running()
        s.advance(50)  // 300
        #expect(
            s.exit(status: 2) == [
                .cancelTimer(.heartbeat), .armTimer(Deadline(kind: .backoff, at: 400)),
                .publishExited(pid: 101, reason: "exited with status 2", restartInMs: 100),
            ])
        #expect(s.life.state == .backoff)
        #expect(s.life.pid == nil)
        #expect(s.life.runningSince == nil)
        #expect(s.advance(100) == [.cancelTimer(.backoff), .spawn, .armTimer(Deadline(kind: .handshake, at: 2_400))])
        #expect(s.life.phase == .starting(pid: 102, deadline: 2_400))
        #expect(s.life.recentRestarts == [400])
    }

    @Test func exitsWithoutAProcessAreIgnored() {
        var s = FakeShell(policy())
        #expect(s.exit(status: 1) == [])
        s.spawnError = "EACCES"
        s.start()
        #expect(s.exit(status: 1) == [], "in backoff")
    }

    @Test func temporaryCleanExitStopsQuietly() {
        var s = running(policy { $0.restart = .temporary })
        #expect(s.exit() == [.cancelTimer(.heartbeat)])
        #expect(s.life.phase == .stopped)
        #expect(s.life.lastExitReason == "exited with status 0")
    }

    @Test func manualRestartOfALivePluginKillsAndRespawnsAtOnce() {
        var s = running()
        #expect(s.restart() == [.cancelTimer(.heartbeat), .signal(SIGKILL, .restartRequested)])
        #expect(s.life.phase == .exiting(pid: 101, since: 250, cause: .restartRequested))
        #expect(s.life.exitIsRequested)
        #expect(s.restart() == [], "already on its way")
        #expect(s.exit(signal: 9) == [.spawn, .armTimer(Deadline(kind: .handshake, at: 2_250))])
        #expect(s.life.lastExitReason == "restarted on request")
        #expect(s.life.restarts == 1)
        #expect(s.life.recentRestarts.isEmpty && s.life.consecutiveFailures == 0)
    }

    @Test func manualRestartAfterALivenessKillRespawnsWithoutAnotherSignal() {
        var s = FakeShell(policy())
        s.start()
        s.advance(2_000)  // no handshake: SIGKILL sent
        #expect(s.restart() == [])
        #expect(s.life.phase == .exiting(pid: 101, since: nil, cause: .restartRequested))
        #expect(s.exit(signal: 9).contains(.spawn))
    }

    @Test func manualRestartCutsABackoffShortAndClearsFailed() {
        var s = running()
        s.exit(status: 1)
        #expect(s.restart() == [.cancelTimer(.backoff), .spawn, .armTimer(Deadline(kind: .handshake, at: 2_250))])
        #expect(s.life.restarts == 0, "a manual start is not a restart")
        var f = running(policy { $0.restart = .temporary })
        f.exit(status: 1)
        #expect(f.life.failedReason == "exited with status 1")
        #expect(f.restart() == [.spawn, .armTimer(Deadline(kind: .handshake, at: 2_250))])
        #expect(f.life.failedReason == nil)
    }

    // MARK: Stop

    @Test func stopAsksThenTheExitEndsStopped() {
        var s = running()
        #expect(s.stop() == [.cancelTimer(.heartbeat), .armTimer(Deadline(kind: .stop, at: 750)), .sendShutdown])
        #expect(s.life.phase == .stopping(pid: 101, step: .asked, deadline: 750))
        #expect(s.life.state == .stopped, "a stopping plugin is not routable")
        #expect(s.life.isAlive && s.life.exitIsRequested)
        #expect(s.stop() == [], "stopping twice does nothing")
        s.advance(100)
        #expect(s.exit() == [.cancelTimer(.stop)])
        #expect(s.life.phase == .stopped)
        #expect(
            !s.performed.contains {
                if case .publishExited = $0 { return true }; return false
            })
    }

    @Test func stopEscalatesToSIGTERMThenSIGKILL() {
        var s = running()
        s.stop()
        #expect(s.advance(499) == [])
        #expect(
            s.advance(1) == [
                .signal(SIGTERM, .stopGraceExpired(graceMs: 500)),
                .armTimer(Deadline(kind: .stop, at: 750 + SupervisorPolicy.termGraceMs)),
            ])
        #expect(s.life.phase == .stopping(pid: 101, step: .terminated, deadline: 750 + SupervisorPolicy.termGraceMs))
        #expect(
            s.advance(SupervisorPolicy.termGraceMs) == [
                .signal(SIGKILL, .termIgnored(graceMs: SupervisorPolicy.termGraceMs)),
                .cancelTimer(.stop),
            ])
        #expect(s.life.phase == .stopping(pid: 101, step: .killed, deadline: nil))
        #expect(s.exit(signal: 9) == [])
        #expect(s.life.phase == .stopped)
        #expect(s.life.lastExitReason == "killed by signal 9")
    }

    @Test func sigtermThatWorksNeedsNoSIGKILL() {
        var s = running()
        s.stop()
        s.advance(500)
        #expect(s.exit(signal: 15) == [.cancelTimer(.stop)])
        #expect(s.advance(10_000) == [])
        #expect(!s.performed.contains(.signal(SIGKILL, .termIgnored(graceMs: SupervisorPolicy.termGraceMs))))
    }

    @Test func stopWithoutAProcessIsImmediate() {
        var s = running()
        s.exit(status: 1)
        #expect(s.stop() == [.cancelTimer(.backoff)], "a pending backoff is cancelled")
        #expect(s.life.phase == .stopped)
        #expect(s.advance(60_000) == [])
        var f = running(policy { $0.restart = .temporary })
        f.exit(status: 1)
        #expect(f.stop() == [])
        #expect(f.life.phase == .stopped)
        var never = FakeShell(policy())
        #expect(never.stop() == [])
        #expect(never.life.hasLeftStarting, "a plugin never started does not hold readiness back")
    }

    @Test func stopWinsOverAPendingRestartAndAChannelGrace() {
        var s = running()
        s.restart()
        #expect(s.stop() == [.armTimer(Deadline(kind: .stop, at: 750)), .sendShutdown])
        #expect(s.restart() == [], "no restart while stopping")
        #expect(s.exit(signal: 9) == [.cancelTimer(.stop)])
        #expect(s.life.phase == .stopped)
        var c = running()
        c.closeChannel()
        #expect(c.stop() == [.cancelTimer(.channelClose), .armTimer(Deadline(kind: .stop, at: 750)), .sendShutdown])
        #expect(c.closeChannel() == [])
    }

    // MARK: Stale events

    @Test func timersOfAPhaseAlreadyLeftDoNothing() {
        var s = running()
        for kind in [PluginLifecycle.TimerKind.handshake, .channelClose, .backoff, .stop] {
            #expect(s.send { $0.timerFired(kind, now: $1) } == [], "\(kind) while running")
        }
        s.stop()
        #expect(s.send { $0.timerFired(.heartbeat, now: $1) } == [])
        #expect(s.send { $0.handshakeCompleted(now: $1) } == [])
        #expect(s.answerHeartbeat() == [])
    }

    /// Random events in any order: the machine never leaves a timer armed that its phase does not
    /// wait on (FakeShell checks after every event), a process is always either alive or exited
    /// once, and the pid is known exactly while one lives.
    @Test func randomEventSequencesKeepTimersAndProcessConsistent() {
        var rng = SplitMix64(seed: 2026)
        for _ in 0..<200 {
            var s = FakeShell(policy { $0.jitter = 0.3 })
            s.start()
            for _ in 0..<60 {
                let r = rng.nextUnit()
                switch Int(r * 9) {
                case 0: s.start()
                case 1: s.hello()
                case 2 where s.life.isAlive: s.exit(status: Int64(rng.nextUnit() * 3), signal: 0)
                case 3: s.stop()
                case 4: s.restart()
                case 5: s.closeChannel()
                case 6: s.answerHeartbeat()
                case 7: s.spawnError = "EAGAIN"
                default: s.advance(UInt64(rng.nextUnit() * 3_000))
                }
                #expect(s.life.isAlive == (s.life.pid != nil) || s.life.phase == .spawning)
                #expect(s.life.phase != .spawning, "the shell always answers a spawn at once")
            }
        }
    }
}
