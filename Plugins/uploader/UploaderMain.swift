import PylonHTTP
import PylonPluginKit
import PylonStore

/// pylon-uploader: the one door through which collected data leaves the machine.
///
/// Other plugins hand it records (`uploader.enqueue`) for named streams under a consent switch.
/// It replies only once they are committed to SQLite (many enqueues share one commit), batches
/// them per stream by count, bytes and interval, and POSTs gzip'd JSON batches with an
/// idempotency key per batch to operator-configured endpoints. Streams have owners, a fixed
/// consent switch and per-owner quotas. See docs/UPLOADER.md.
///
/// The plugin as a library: `run()` is its whole program. The `pylon-uploader` executable
/// (`main/main.swift`) and the multi-call `pylon` binary (Sources/pylon) call it.
public enum UploaderMain {
    public static func run() -> Never {
        let plugin = Plugin(name: "uploader", version: "0.1.0")
        // The reader the uploader starts with (`UploaderConfig`), for `--check-config`.
        plugin.checkConfig = { j throws(ConfigProblems) in
            do throws(UploaderConfigError) {
                _ = try UploaderConfig(j)
            } catch {
                throw ConfigProblems("config: " + error.description)
            }
            return []
        }
        // Every request carries the host's `_pylon` caller info: streams are owned (docs/UPLOADER.md).
        plugin.wantsCallerInfo = true
        // Built from the host's welcome (config, state directory) in `onReady`; the host routes
        // no request before it, so `serve` only guards.
        var uploader: Uploader?
        func serve(_ method: @escaping (Uploader, Call) -> Void) -> (Call) -> Void {
            { call in
                guard let u = uploader else { return call.fail(RPCError(.pluginUnavailable, "the uploader is starting")) }
                method(u, call)
            }
        }

        // The hot path: served from the request's bytes, answered after the group commit.
        plugin.method("enqueue", consent: "{consent}", reads: .text, serve { $0.enqueue($1) })
        plugin.method("flush", serve { $0.flush($1) })
        plugin.method("status", serve { $0.status($1) })
        plugin.method("deadLetters", serve { $0.deadLetters($1) })
        plugin.method("requeue", serve { $0.requeue($1) })
        plugin.method("discard", serve { $0.discard($1) })
        plugin.method("configureStream", serve { $0.configureStream($1) })
        // Admins only: hand a stream to another owner, or release it (docs/UPLOADER.md, "Owners").
        plugin.method("setOwner", serve { $0.setOwner($1) })
        UploaderMethodDocs.declare(plugin)
        plugin.onReady = {
            uploader = Uploader.open(plugin)
            uploader?.reportConsentAtStart()
        }
        plugin.onConsentChanged = { key, granted in
            uploader?.consentChanged(key: key, granted: granted)
            uploader?.reportConsent(key: key, granted: granted)  // opt-outs reach the server
        }
        plugin.onShutdown = { uploader?.shutdown() }
        plugin.run()
    }
}
