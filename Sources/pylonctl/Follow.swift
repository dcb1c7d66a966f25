import PylonClientKit
import PylonProtocol

#if canImport(Glibc)
import Glibc
#endif

/// `sub` and `monitor`: print notifications as they come, and when the host goes away (a
/// restart, an upgrade) connect again with backoff and set up again, saying on stderr how long
/// the gap was (what was sent meanwhile was missed). `--no-reconnect`: exit 69 instead.

/// The first wait before connecting again, doubled after each failed attempt up to the most.
let followFirstDelayMs = 50
let followMaxDelayMs = 2_000

/// Exits with the conventional status for an error of `setup`'s calls (as `call` does).
func exitFor(_ error: any Error) -> Never {
    switch error {
    case let e as RPCError:
        var msg = "error \(e.code): \(e.message)"
        if let d = e.data { msg += " \(d.serialized)" }
        fail(msg, code: e.code == RPCError.Code.notPermitted.rawValue ? 77 : 1)
    case let e as ClientError: fail(e.description, code: e.kind == .timeout ? 75 : 69)
    default: fail("\(error)", code: 1)
    }
}

/// Runs `setup` on a connection (subscribe, monitor), then shows every notification; reconnects
/// when the connection ends unless `reconnect` is false (then exit 69 with `lost`).
@MainActor func follow(reconnect: Bool, lost: String, setup: (SyncClient) throws -> Void, show: (JSON) -> Void) -> Never {
    var client = connect()
    do { try setup(client) } catch { exitFor(error) }
    while true {
        do {
            while true {
                for n in client.notifications { show(n) }
                client.notifications.removeAll()
                if let n = try client.nextNotification(timeoutMs: 3_600_000) { show(n) }
                fflush(nil)  // line by line, also into a pipe
            }
        } catch {
            fflush(nil)
            guard reconnect else { fail(error.kind == .closed ? lost : "\(error)", code: 69) }
            Log.writeRaw("pylonctl: \(error.kind == .closed ? lost : error.description); reconnecting (--no-reconnect: exit instead)\n")
        }
        let lostAt = Loop.hrtimeNs
        var delayMs = followFirstDelayMs
        while true {
            usleep(useconds_t(delayMs * 1000))
            delayMs = min(delayMs * 2, followMaxDelayMs)
            guard let c = try? SyncClient(path: socketPath) else { continue }
            do {
                try setup(c)
            } catch let e as ClientError {
                _ = e
                continue  // gone again
            } catch {
                exitFor(error)  // refused now (permissions changed): say so
            }
            client = c
            break
        }
        let gap = Double((Loop.hrtimeNs - lostAt) / 1_000_000) / 1000
        Log.writeRaw("pylonctl: reconnected after \(gap) s; notifications sent meanwhile were missed\n")
    }
}
