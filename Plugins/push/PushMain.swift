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
        let push = PushService(plugin: plugin)
        plugin.checkConfig = { j throws(ConfigProblems) in try PushConfig(j).warnings }

        plugin.onReady = { push.start() }
        plugin.onShutdown = { push.shutdown() }
        plugin.subscribe("bus.client.closed") { _, p in if let c = p["client"]?.intValue { push.clientClosed(c) } }

        plugin.method("register") { call in push.registerCall(call) }
        plugin.method("setDeviceToken") { call in push.setDeviceToken(call) }
        plugin.method("bind") { call in push.bind(call, unbind: false) }
        plugin.method("unbind") { call in push.bind(call, unbind: true) }
        plugin.method("openLogReport", consent: "push:opens") { call in push.openLogReport(call) }
        plugin.method("liveActivityBind") { call in push.liveActivityBind(call) }
        plugin.method("attach") { call in push.attach(call) }
        plugin.method("detach") { call in push.detach(call) }
        plugin.method("status") { call in call.reply(push.status(for: call)) }
        // Admins only: hand an appId to another uid, or release it (docs/PUSH.md, "App owners").
        plugin.method("setOwner") { call in push.setOwner(call) }

        plugin.run()
    }
}
