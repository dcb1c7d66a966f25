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
        let uploader = Uploader(plugin: plugin)
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

        // The hot path: served from the request's bytes, answered after the group commit.
        plugin.method("enqueue", consent: "{consent}", reads: .text) { uploader.enqueue($0) }
        plugin.method("flush") { uploader.flush($0) }
        plugin.method("status") { uploader.status($0) }
        plugin.method("deadLetters") { uploader.deadLetters($0) }
        plugin.method("requeue") { uploader.requeue($0) }
        plugin.method("discard") { uploader.discard($0) }
        plugin.method("configureStream") { uploader.configureStream($0) }
        // Admins only: hand a stream to another owner, or release it (docs/UPLOADER.md, "Owners").
        plugin.method("setOwner") { uploader.setOwner($0) }
        plugin.onReady = { uploader.start() }
        plugin.onConsentChanged = { key, granted in uploader.consentChanged(key: key, granted: granted) }
        plugin.onShutdown = { uploader.shutdown() }
        plugin.run()
    }
}
