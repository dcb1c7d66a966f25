import PylonPluginKit

/// pylon-push: mPaaS-style push for local apps (docs/PUSH.md). Messages arrive from an MQTT
/// broker (persistent session, QoS 1) and are delivered to the app that attached, through the
/// callback it serves on the bus.
///
/// The plugin as a library: `run()` is its whole program. The `pylon-push` executable
/// (`main/main.swift`) and the multi-call `pylon` binary (Sources/pylon) call it.
public enum PushMain {
    public static func run() -> Never {
        let plugin = Plugin(name: "push", version: "0.1.0")
        plugin.wantsCallerInfo = true
        plugin.checkConfig = { j throws(ConfigProblems) in try PushConfig(j).warnings }
        // Built from the host's welcome (config, state directory) in `onReady` (the kit's
        // `service`); the host routes no request before it, so `push.serve` only guards.
        let push = plugin.service(PushService.open)
        plugin.onShutdown = { push.current?.shutdown() }
        plugin.subscribe("bus.client.closed") { _, p in if let c = p["client"]?.intValue { push.current?.clientClosed(c) } }

        plugin.method("register", push.serve { $0.registerCall($1) })
        plugin.method("setDeviceToken", push.serve { $0.setDeviceToken($1) })
        plugin.method("bind", push.serve { $0.bind($1, unbind: false) })
        plugin.method("unbind", push.serve { $0.bind($1, unbind: true) })
        plugin.method("openLogReport", consent: "push:opens", push.serve { $0.openLogReport($1) })
        plugin.method("liveActivityBind", push.serve { $0.liveActivityBind($1) })
        plugin.method("attach", push.serve { $0.attach($1) })
        plugin.method("detach", push.serve { $0.detach($1) })
        plugin.method("status", push.serve { $1.reply($0.status(for: $1)) })
        // Admins only: hand an appId to another uid, or release it (docs/PUSH.md, "App owners").
        plugin.method("setOwner", push.serve { $0.setOwner($1) })
        PushMethodDocs.declare(plugin)

        plugin.run()
    }
}
