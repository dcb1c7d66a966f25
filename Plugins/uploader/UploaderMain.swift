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
            return UploaderConfig.unknown(j)
        }
        // Every request carries the host's `_pylon` caller info: streams are owned (docs/UPLOADER.md).
        plugin.wantsCallerInfo = true
        // Built from the host's welcome (config, state directory) in `onReady` (the kit's
        // `service`); the host routes no request before it, so `uploader.serve` only guards.
        let uploader = plugin.service { p in
            for w in UploaderConfig.unknown(p.config) { p.log.warn("configuration", ["warning": w]) }
            let u = Uploader.open(p)
            u.reportConsentAtStart()
            return u
        }

        // The hot path: served from the request's bytes, answered after the group commit.
        plugin.method("enqueue", consent: "{consent}", reads: .text, uploader.serve { $0.enqueue($1) })
        plugin.method("flush", uploader.serve { $0.flush($1) })
        plugin.method("status", uploader.serve { $0.status($1) })
        plugin.method("deadLetters", uploader.serve { $0.deadLetters($1) })
        plugin.method("requeue", uploader.serve { $0.requeue($1) })
        plugin.method("discard", uploader.serve { $0.discard($1) })
        plugin.method("configureStream", uploader.serve { $0.configureStream($1) })
        // Admins only: hand a stream to another owner, or release it (docs/UPLOADER.md, "Owners").
        plugin.method("setOwner", uploader.serve { $0.setOwner($1) })
        UploaderMethodDocs.declare(plugin)
        plugin.onConsentChanged = { key, granted in
            uploader.current?.consentChanged(key: key, granted: granted)
            uploader.current?.reportConsent(key: key, granted: granted)  // opt-outs reach the server
        }
        plugin.onShutdown = { uploader.current?.shutdown() }
        plugin.run()
    }
}
