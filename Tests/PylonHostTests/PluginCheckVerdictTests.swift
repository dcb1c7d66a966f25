import PylonCore
import Testing

@testable import PylonHost

/// What a plugin's `--check-config` answer means (`HostConfig.verdict`) and where a refused
/// reload shows a plugin's problem in the file (`HostConfig.line(of:in:)`), without processes.
struct PluginCheckVerdictTests {
    @Test func exitStatusesMeanAcceptedRefusedOrNotChecked() {
        let ok = HostConfig.verdict(plugin: "ma", status: 0, stdout: ["warning: config.typo: unknown setting", "config ok"], stderr: [])
        #expect(ok.problems.isEmpty && ok.warnings == ["plugin ma: config.typo: unknown setting"])
        let refused = HostConfig.verdict(plugin: "uploader", status: 78, stdout: [], stderr: ["config: endpoint x: bad"])
        #expect(refused.problems == [HostConfig.PluginProblem(plugin: "uploader", message: "config: endpoint x: bad")])
        #expect(refused.problems.first?.description == "plugin uploader: config: endpoint x: bad")
        let silent = HostConfig.verdict(plugin: "gtm", status: 78, stdout: [], stderr: [])
        #expect(silent.problems.first?.message == "the configuration is refused (exit 78)")
        let late = HostConfig.verdict(plugin: "push", status: nil, stdout: [], stderr: ["ignored"])
        #expect(late.problems.isEmpty && late.warnings.first?.contains("did not answer --check-config within 5000 ms") == true)
        let other = HostConfig.verdict(plugin: "py", status: 1, stdout: [], stderr: ["Traceback"])
        #expect(
            other.problems.isEmpty && other.warnings == ["plugin py: --check-config exited 1 (not supported?); its config is not checked"])
    }

    static let file = """
        {
          "socket": "/run/pylon/pylon.sock",
          "plugins": [
            { "name": "ma", "exec": "pylon-ma" },
            {
              "name": "uploader",
              "exec": "pylon-uploader",
              "config": {
                "fsync": "normal",
                "endpoint": "gopher://x/{stream}"
              }
            }
          ]
        }
        """

    func line(_ plugin: String, _ message: String, in text: String = file) -> Int? {
        HostConfig.line(of: HostConfig.PluginProblem(plugin: plugin, message: message), in: Array(text.utf8))
    }

    @Test func aProblemIsShownAtItsSettingElseAtThePluginsConfigOrEntry() {
        #expect(line("uploader", "config: endpoint gopher://x/{stream}: scheme gopher is not allowed") == 10, "the setting's line")
        #expect(line("uploader", "config.fsync: must be one of \"full\", \"normal\"") == 9)
        #expect(line("uploader", "config.retryMaxMs: must be an integer") == 8, "an absent setting: the config's line")
        #expect(line("uploader", "the configuration is refused (exit 78)") == 8)
        #expect(line("ma", "config.x: bad") == 4, "no config: the plugin's entry")
        #expect(line("gtm", "config.x: bad") == nil, "no such plugin")
        #expect(line("ma", "x", in: "{ not json") == nil)
        let located = HostConfig.located(
            [
                HostConfig.PluginProblem(plugin: "uploader", message: "config: endpoint gopher://x: bad"),
                .init(plugin: "gtm", message: "m"),
            ],
            path: "/etc/pylon/pylon.json", text: Array(Self.file.utf8))
        #expect(
            located == [
                "/etc/pylon/pylon.json:10: plugin uploader: config: endpoint gopher://x: bad", "/etc/pylon/pylon.json: plugin gtm: m",
            ])
    }

    @Test func theSettingAMessageNames() {
        #expect(HostConfig.settingName("config.retryMaxMs: must be an integer") == "retryMaxMs")
        #expect(HostConfig.settingName("config.broker: brokers: bad") == "broker")
        #expect(HostConfig.settingName("config: maxDiskBytes must be an integer") == "maxDiskBytes")
        #expect(HostConfig.settingName("config: must be an object") == "must", "a word that is no setting is not found in the config")
        #expect(HostConfig.settingName("something else") == nil)
    }

    @Test func aPluginWithCheckConfigFalseIsNotRunAndSaidSoOnce() throws {
        let c = try HostConfig.parse(
            try JSON.parse(
                """
                {"socket": "/tmp/s.sock", "plugins": [
                  {"name": "own", "exec": "/bin/true"},
                  {"name": "third", "exec": "/bin/true", "checkConfig": false},
                  {"name": "off", "exec": "/bin/true", "checkConfig": false, "enabled": false}]}
                """))
        #expect(c.plugins.map(\.checkConfig) == [true, false, false])
        #expect(c.pluginCheckInvocations(selfDir: nil, path: "/bin", environment: []).map(\.plugin) == ["own"])
        #expect(
            c.uncheckedPluginNotes == [
                "plugin third: not asked to check its config (\"checkConfig\": false); its settings are not checked before start"
            ])
        #expect(throws: ConfigError.self) {
            try HostConfig.parse(try JSON.parse(#"{"plugins": [{"name": "x", "exec": "/bin/true", "checkConfig": "no"}]}"#))
        }
    }
}
