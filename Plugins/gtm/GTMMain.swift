import PylonPluginKit

/// pylon-gtm: tag-manager containers as a service (docs/GTM.md).
///
/// The plugin as a library: `run()` is its whole program. The `pylon-gtm` executable
/// (`main/main.swift`) and the multi-call `pylon` binary (Sources/pylon) call it.
public enum GTMMain {
    public static func run() -> Never {
        let plugin = Plugin(name: "gtm", version: "0.1.0")
        plugin.wantsCallerInfo = true
        // Built from the host's welcome (`GTMService.open`); `gtm.serve` answers -32001 before.
        let gtm = plugin.service(GTMService.open)
        plugin.checkConfig = { j throws(ConfigProblems) in try GTMLimits(j).warnings }

        plugin.subscribe("bus.client.closed") { _, p in if let c = p["client"]?.intValue { gtm.current?.clientClosed(c) } }
        plugin.declarePublishes("gtm.container.refresh")
        plugin.declarePublishes("gtm.container.available")
        plugin.declarePublishes(GTMLog.topic)
        plugin.declarePublishes("gtm.started")

        plugin.method("openContainer", gtm.serve { $0.open($1) })
        plugin.method("closeContainer", gtm.serve { $0.close($1) })
        plugin.method("getValue", gtm.serve { $0.getValue($1) })
        plugin.method("push", gtm.serve { $0.push($1) })
        plugin.method("refresh", gtm.serve { $0.refresh($1) })
        plugin.method("preview", gtm.serve { $0.preview($1) })
        plugin.method("registerFunctionCallMacro", gtm.serve { $0.register($1, tag: false) })
        plugin.method("registerFunctionCallTag", gtm.serve { $0.register($1, tag: true) })
        plugin.method("setLogLevel", gtm.serve { $0.setLogLevel($1) })
        plugin.method("logLines", gtm.serve { $0.logLines($1) })
        plugin.method("status", gtm.serve { $0.status($1) })
        GTMMethodDocs.declare(plugin)

        plugin.run()
    }
}
