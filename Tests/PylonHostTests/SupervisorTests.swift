import Testing
@testable import PylonHost

/// The supervisor state machine driven by a fake clock: no processes, no sleeps.
struct SupervisorTests {
    func policy(_ f: (inout SupervisorPolicy) -> Void = { _ in }) -> SupervisorPolicy {
        var p = SupervisorPolicy()
        p.backoffInitialMs = 100
        p.backoffMaxMs = 1_000
        p.jitter = 0
        p.maxRestarts = 3
        p.intensityWindowMs = 10_000
        p.resetAfterMs = 5_000
        f(&p)
        return p
    }

    /// Runs a plugin to `running` at `now`.
    func started(_ p: SupervisorPolicy, now: UInt64 = 0) -> PluginLifecycle {
        var l = PluginLifecycle(policy: p)
        #expect(l.start(now: now) == .spawn)
        #expect(l.state == .starting)
        _ = l.handshakeCompleted(now: now)
        #expect(l.state == .running)
        return l
    }

    @Test func crashSchedulesRestartWithExponentialBackoff() {
        var l = started(policy())
        var now: UInt64 = 1
        var delays: [UInt64] = []
        for _ in 0..<3 {
            guard case .scheduleRestart(let d) = l.exited(now: now, status: 1, signal: 0) else {
                Issue.record("expected a restart"); return
            }
            delays.append(d)
            #expect(l.state == .backoff)
            now += d
            #expect(l.backoffElapsed(now: now) == .spawn)
            _ = l.handshakeCompleted(now: now)
            now += 1
        }
        #expect(delays == [100, 200, 400])
        #expect(l.restarts == 3)
    }

    @Test func backoffIsCapped() {
        var l = PluginLifecycle(policy: policy())
        let d = [1, 4, 5, 30].map { l.backoffDelay(failures: $0) }
        #expect(d == [100, 800, 1_000, 1_000])
    }

    @Test func jitterStaysWithinBounds() {
        var l = PluginLifecycle(policy: policy { $0.jitter = 0.25; $0.backoffMaxMs = 100_000 }, seed: 42)
        var seen = Set<UInt64>()
        for _ in 0..<500 {
            let d = l.backoffDelay(failures: 3)  // base 400
            #expect(d >= 300 && d <= 500)
            seen.insert(d)
        }
        #expect(seen.count > 20, "jitter should spread delays")
    }

    @Test func jitterNeverExceedsCap() {
        var l = PluginLifecycle(policy: policy { $0.jitter = 0.5 }, seed: 7)
        for _ in 0..<200 { #expect(l.backoffDelay(failures: 10) <= 1_000) }
    }

    @Test func intensityLimitMarksFailed() {
        var l = started(policy())
        var now: UInt64 = 10
        for _ in 0..<3 {
            guard case .scheduleRestart(let d) = l.exited(now: now, status: 0, signal: 9) else {
                Issue.record("expected a restart"); return
            }
            now += d
            _ = l.backoffElapsed(now: now)
            _ = l.handshakeCompleted(now: now)
            now += 10
        }
        guard case .markFailed(let reason) = l.exited(now: now, status: 0, signal: 9) else {
            Issue.record("expected failed"); return
        }
        #expect(reason.contains("intensity"))
        #expect(l.state == .failed)
        #expect(l.backoffElapsed(now: now + 100_000) == .none, "a failed plugin is not restarted by itself")
    }

    @Test func restartsOutsideTheWindowDoNotCount() {
        var l = started(policy { $0.intensityWindowMs = 1_000; $0.resetAfterMs = 1_000_000 })
        var now: UInt64 = 0
        for _ in 0..<10 {
            now += 2_000  // each crash more than a window after the previous restart
            guard case .scheduleRestart(let d) = l.exited(now: now, status: 1, signal: 0) else {
                Issue.record("expected a restart"); return
            }
            now += d
            _ = l.backoffElapsed(now: now)
            _ = l.handshakeCompleted(now: now)
        }
        #expect(l.state == .running)
    }

    @Test func healthyUptimeResetsBackoff() {
        var l = started(policy())
        guard case .scheduleRestart(let d1) = l.exited(now: 10, status: 1, signal: 0) else { Issue.record("restart"); return }
        _ = l.backoffElapsed(now: 10 + d1)
        _ = l.handshakeCompleted(now: 10 + d1)
        guard case .scheduleRestart(let d2) = l.exited(now: 20 + d1, status: 1, signal: 0) else { Issue.record("restart"); return }
        #expect(d2 == 200)
        let t = 20 + d1 + d2
        _ = l.backoffElapsed(now: t)
        _ = l.handshakeCompleted(now: t)
        // Healthy for longer than resetAfterMs: the next crash starts the backoff afresh.
        guard case .scheduleRestart(let d3) = l.exited(now: t + 6_000, status: 1, signal: 0) else { Issue.record("restart"); return }
        #expect(d3 == 100)
        #expect(l.consecutiveFailures == 1)
    }

    @Test func transientRestartsOnlyAfterAbnormalExit() {
        var l = started(policy { $0.restart = .transient })
        #expect(l.exited(now: 5, status: 0, signal: 0) == .none)
        #expect(l.state == .stopped)
        var l2 = started(policy { $0.restart = .transient })
        if case .scheduleRestart = l2.exited(now: 5, status: 3, signal: 0) {} else { Issue.record("expected restart") }
    }

    @Test func temporaryIsNeverRestarted() {
        var l = started(policy { $0.restart = .temporary })
        if case .markFailed = l.exited(now: 5, status: 1, signal: 0) {} else { Issue.record("expected failed") }
        var l2 = started(policy { $0.restart = .temporary })
        #expect(l2.exited(now: 5, status: 0, signal: 0) == .none)
        #expect(l2.state == .stopped)
    }

    @Test func permanentRestartsEvenAfterCleanExit() {
        var l = started(policy())
        if case .scheduleRestart = l.exited(now: 5, status: 0, signal: 0) {} else { Issue.record("expected restart") }
    }

    @Test func exitStatus78IsAPermanentFailure() {
        var l = started(policy())
        if case .markFailed(let r) = l.exited(now: 5, status: exitStatusPermanentFailure, signal: 0) {
            #expect(r.contains("78"))
        } else {
            Issue.record("expected failed")
        }
    }

    @Test func missedHeartbeatKillsThenRestarts() {
        var l = started(policy())
        #expect(l.heartbeatMissed(now: 100) == .kill(signal: 9))
        if case .scheduleRestart = l.exited(now: 101, status: 0, signal: 9) {} else { Issue.record("expected restart") }
        #expect(l.lastExitReason?.contains("heartbeat") == true)
    }

    @Test func missedHandshakeKillsThenRestarts() {
        var l = PluginLifecycle(policy: policy())
        _ = l.start(now: 0)
        #expect(l.handshakeTimedOut(now: 10_000) == .kill(signal: 9))
        if case .scheduleRestart = l.exited(now: 10_001, status: 0, signal: 9) {} else { Issue.record("expected restart") }
    }

    @Test func heartbeatIgnoredWhenNotRunning() {
        var l = PluginLifecycle(policy: policy())
        #expect(l.heartbeatMissed(now: 1) == .none)
    }

    @Test func requestedStopEndsStoppedWithoutRestart() {
        var l = started(policy())
        #expect(l.stop(now: 1) == .shutdown(graceMs: l.policy.stopGraceMs))
        #expect(l.exited(now: 2, status: 0, signal: 15) == .none)
        #expect(l.state == .stopped)
    }

    @Test func manualStartClearsFailed() {
        var l = started(policy { $0.restart = .temporary })
        _ = l.exited(now: 1, status: 1, signal: 0)
        #expect(l.state == .failed)
        #expect(l.start(now: 2) == .spawn)
        #expect(l.state == .starting)
    }

    @Test func manualRestartDoesNotSpendTheBudget() {
        var l = started(policy { $0.maxRestarts = 1 })
        for i in 0..<5 {
            #expect(l.restartRequested(now: UInt64(i * 10)) == .kill(signal: 9))
            #expect(l.exited(now: UInt64(i * 10 + 1), status: 0, signal: 9) == .spawn)
            _ = l.handshakeCompleted(now: UInt64(i * 10 + 2))
        }
        #expect(l.state == .running)
        #expect(l.recentRestarts.isEmpty)
        // The automatic budget is still whole: one crash is restarted.
        if case .scheduleRestart = l.exited(now: 100, status: 1, signal: 0) {} else { Issue.record("expected restart") }
    }

    @Test func spawnFailureBacksOff() {
        var l = PluginLifecycle(policy: policy())
        _ = l.start(now: 0)
        if case .scheduleRestart = l.spawnFailed(now: 1, error: "ENOENT") {} else { Issue.record("expected restart") }
        #expect(l.lastExitReason?.contains("ENOENT") == true)
    }
}
