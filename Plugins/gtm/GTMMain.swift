import PylonPluginKit

/// pylon-gtm: tag-manager containers as a service (docs/GTM.md).
///
/// The plugin as a library: `run()` is its whole program. The `pylon-gtm` executable
/// (`main/main.swift`) and the multi-call `pylon` binary (Sources/pylon) call it.
public enum GTMMain {
    public static func run() -> Never {
        let plugin = Plugin(name: "gtm", version: "0.1.0")
        plugin.wantsCallerInfo = true
        let gtm = GTMService(plugin: plugin)
        plugin.checkConfig = { j throws(ConfigProblems) in try GTMLimits(j).warnings }

        plugin.onReady = { gtm.start() }
        plugin.subscribe("bus.client.closed") { _, p in if let c = p["client"]?.intValue { gtm.clientClosed(c) } }
        plugin.declarePublishes("gtm.container.refresh")
        plugin.declarePublishes("gtm.container.available")
        plugin.declarePublishes(GTMLog.topic)
        plugin.declarePublishes("gtm.started")

        plugin.method("openContainer") { gtm.open($0) }
        plugin.method("closeContainer") { gtm.close($0) }
        plugin.method("getValue") { gtm.getValue($0) }
        plugin.method("push") { gtm.push($0) }
        plugin.method("refresh") { gtm.refresh($0) }
        plugin.method("preview") { gtm.preview($0) }
        plugin.method("registerFunctionCallMacro") { gtm.register($0, tag: false) }
        plugin.method("registerFunctionCallTag") { gtm.register($0, tag: true) }
        plugin.method("setLogLevel") { gtm.setLogLevel($0) }
        plugin.method("logLines") { gtm.logLines($0) }
        plugin.method("status") { gtm.status($0) }
        GTMMethodDocs.declare(plugin)

        plugin.run()
    }
}
