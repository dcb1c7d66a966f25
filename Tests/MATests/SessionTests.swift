import Testing

@testable import pylon_ma

/// The app-session machine (`MASession`) on a fake clock: no plugin, no timers, no sleeps.
struct SessionTests {
    /// A clock the test moves by hand, and the one timer the shell would keep.
    struct World {
        var now: UInt64 = 10_000
        var session = MASession()
        var timer: UInt64?
        var events: [String] = []
        var persisted = 0
        var ids = 0
        let timeoutMs: UInt64 = 30_000

        mutating func apply(_ effects: [MASession.Effect]) {
            for e in effects {
                switch e {
                case .started(let id): events.append("start \(id)")
                case .ended(let id): events.append("end \(id)")
                case .persist: persisted += 1
                case .arm(let at): timer = at
                case .cancel: timer = nil
                }
            }
        }
        mutating func touch() {
            var n = ids
            let effects = session.touch(now: now, timeoutMs: timeoutMs) {
                n += 1
                return "s\(n)"
            }
            ids = n
            apply(effects)
        }
        mutating func background(_ bg: Bool) { apply(session.setBackground(bg, now: now, timeoutMs: timeoutMs)) }
        /// Moves the clock by `ms`, firing the timer when the clock passes it (as libuv would).
        mutating func advance(_ ms: UInt64) {
            let end = now + ms
            while let t = timer, t <= end {
                now = t
                timer = nil
                apply(session.timerFired(now: now))
            }
            now = end
        }
    }

    @Test func theFirstActivityStartsASessionAndTheForegroundNeverEndsIt() {
        var w = World()
        w.touch()
        #expect(w.events == ["start s1"] && w.persisted == 1 && w.timer == nil)
        w.touch()
        #expect(w.events == ["start s1"] && w.persisted == 1, "a session starts once")
        w.advance(10 * w.timeoutMs)
        #expect(w.session.id == "s1" && w.events == ["start s1"], "no timer in the foreground")
    }

    @Test func theBackgroundEndsTheSessionExactlyTheTimeoutLater() {
        var w = World()
        w.touch()
        w.background(true)
        #expect(w.timer == 10_000 + 30_000 && w.session.deadline == 40_000 && w.persisted == 2)
        w.advance(29_999)
        #expect(w.session.id == "s1" && w.events == ["start s1"], "1 ms before the timeout")
        w.advance(1)
        #expect(w.session.id == nil && w.events == ["start s1", "end s1"] && w.persisted == 3)
        #expect(w.session.background && w.timer == nil)
        // The next activity is a new session, still in the background: its own end is armed.
        w.touch()
        #expect(w.events.last == "start s2" && w.timer == 40_000 + 30_000)
    }

    @Test func activityInTheBackgroundMovesTheEnd() {
        var w = World()
        w.touch()
        w.background(true)
        w.advance(20_000)
        w.touch()  // at 30_000
        #expect(w.timer == 60_000)
        w.advance(29_999)
        #expect(w.session.id == "s1")
        w.advance(1)
        #expect(w.events == ["start s1", "end s1"])
    }

    @Test func comingBackToTheForegroundKeepsTheSession() {
        var w = World()
        w.touch()
        w.background(true)
        w.advance(29_000)
        w.background(false)
        #expect(w.timer == nil && w.session.deadline == nil && !w.session.background)
        w.advance(10 * w.timeoutMs)
        #expect(w.events == ["start s1"])
        // Going to the background again gives a full timeout from then.
        w.background(true)
        #expect(w.timer == w.now + w.timeoutMs)
    }

    @Test func aTimerThatFiresEarlyIsArmedAgainAndOneWithoutADeadlineDoesNothing() {
        var s = MASession()
        _ = s.touch(now: 0, timeoutMs: 1_000) { "a" }
        _ = s.setBackground(true, now: 0, timeoutMs: 1_000)
        #expect(s.timerFired(now: 999) == [.arm(at: 1_000)])
        #expect(s.id == "a")
        #expect(s.timerFired(now: 1_000) == [.ended(id: "a"), .persist])
        #expect(s.timerFired(now: 5_000) == [], "nothing armed: nothing to end")
        _ = s.setBackground(false, now: 5_000, timeoutMs: 1_000)
        #expect(s.timerFired(now: 9_000) == [])
    }

    @Test func aZeroTimeoutIsOneMillisecond() {
        var s = MASession()
        #expect(s.setBackground(true, now: 7, timeoutMs: 0) == [.persist, .arm(at: 8)])
    }

    @Test func aRestoredBackgroundSessionEndsAFullTimeoutAfterTheRestart() {
        var s = MASession(id: "old", background: true)
        #expect(s.restored(now: 500, timeoutMs: 2_000) == [.arm(at: 2_500)])
        #expect(s.timerFired(now: 2_500) == [.ended(id: "old"), .persist])
        var fg = MASession(id: "old", background: false)
        #expect(fg.restored(now: 500, timeoutMs: 2_000) == [], "a foreground session waits for the background")
        var none = MASession(id: nil, background: true)
        #expect(none.restored(now: 500, timeoutMs: 2_000) == [])
    }
}
