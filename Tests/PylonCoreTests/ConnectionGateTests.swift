import Testing

@testable import PylonCore

/// A connection's input gate without libuv: every transition and the effects `sync` returns.
struct ConnectionGateTests {
    typealias E = ConnectionGate.Effects

    @Test func readingStartsWhenWantedAndStopsWhenNot() {
        var g = ConnectionGate()
        do {
            let r = g.sync(hasBacklog: false)
            #expect(r == E(), "nothing wanted: nothing to do")
        }
        do {
            let r = g.startReading()
            #expect(r)
        }
        do {
            let r = g.sync(hasBacklog: false)
            #expect(r == E(startRead: true))
        }
        do {
            let r = g.sync(hasBacklog: false)
            #expect(r == E(), "already reading")
        }
        g.stopReading()
        do {
            let r = g.sync(hasBacklog: false)
            #expect(r == E(stopRead: true))
        }
        #expect(!g.uvReading)
    }

    @Test func backpressureAndHoldsCloseTheGate() {
        var g = ConnectionGate()
        _ = g.startReading()
        _ = g.sync(hasBacklog: false)
        g.setBackpressured(true)
        #expect(!g.gateOpen && !g.canDispatch)
        do {
            let r = g.sync(hasBacklog: false)
            #expect(r == E(stopRead: true))
        }
        g.hold()
        g.hold()
        g.setBackpressured(false)
        #expect(g.isHeld && !g.gateOpen)
        do {
            let r = g.sync(hasBacklog: false)
            #expect(r == E())
        }
        g.release()
        do {
            let r = g.sync(hasBacklog: false)
            #expect(r == E(), "one hold is left")
        }
        g.release()
        do {
            let r = g.sync(hasBacklog: false)
            #expect(g.gateOpen && r == E(startRead: true), "the last hold reopens it")
        }
    }

    @Test func aBacklogGoesFirstAndIsScheduledOnce() {
        var g = ConnectionGate()
        _ = g.startReading()
        _ = g.sync(hasBacklog: false)
        // The gate closed mid-read: the rest is kept; libuv stops while the backlog waits.
        g.hold()
        do {
            let r = g.sync(hasBacklog: true)
            #expect(r == E(stopRead: true), "held: no backlog dispatch either")
        }
        g.release()
        do {
            let r = g.sync(hasBacklog: true)
            #expect(r == E(scheduleBacklog: true), "reopened: the backlog first, not a new read")
        }
        do {
            let r = g.sync(hasBacklog: true)
            #expect(r == E(), "scheduled once")
        }
        g.backlogRan()
        do {
            let r = g.sync(hasBacklog: false)
            #expect(r == E(startRead: true), "backlog done: reading resumes")
        }
    }

    @Test func halfCloseThenCloseAfterFlush() {
        var g = ConnectionGate()
        _ = g.startReading()
        _ = g.sync(hasBacklog: false)
        g.peerShutDown()
        #expect(g.phase == .halfClosed && g.peerShutdown && !g.wantsReading)
        do {
            let r = g.sync(hasBacklog: false)
            #expect(r == E(stopRead: true))
        }
        do {
            let r = g.startReading()
            #expect(!r, "no more input after the peer's shutdown")
        }
        g.closeAfterFlush()
        #expect(g.phase == .closingAfterFlush(peerShutdown: true) && g.peerShutdown && g.closeWhenFlushed)
        do {
            let r = g.close()
            #expect(r == false, "not reading")
        }
        #expect(g.phase == .closed(peerShutdown: true) && g.peerShutdown && !g.gateOpen, "the shutdown stays reported")
        do {
            let r = g.close()
            #expect(r == false && g.isClosed, "closing twice is a no-op")
        }
    }

    @Test func closeStopsAnActiveRead() {
        var g = ConnectionGate()
        _ = g.startReading()
        _ = g.sync(hasBacklog: false)
        g.closeAfterFlush()
        #expect(g.phase == .closingAfterFlush(peerShutdown: false) && !g.peerShutdown)
        do {
            let r = g.close()
            #expect(r, "libuv was reading: stop it")
        }
        #expect(!g.uvReading && g.phase == .closed(peerShutdown: false))
        do {
            let r = g.sync(hasBacklog: true)
            #expect(r == E(), "a closed connection neither reads nor schedules")
        }
        do {
            let r = g.startReading()
            #expect(!r)
        }
    }
}
