import Foundation
import HeraldCore
import Mustache

/// The dashboard's pages, style sheet and scripts: SwiftPM resources of this module
/// (Sources/LabCoordinator/Dashboard/), read once when the first coordinator starts. Pages are
/// Mustache templates (swift-mustache) whose `{{x}}` escapes by default, with `OutsideText.html`
/// (controls and direction marks made visible too): each template opens with the pragma
/// `{{% CONTENT_TYPE: HERALDLAB_HTML}}`, and the loader refuses one that does not. A missing or
/// unparsable file stops the coordinator at its start, naming the file.
struct DashboardTemplates: Sendable {
    /// The templates, by name (`<name>.mustache`): pages and the partials they include.
    static let templateNames = ["layout", "signin", "message", "lab", "runs", "run", "trends", "trendgroup", "crosslab", "study", "summary", "studies", "verdict"]
    /// The files served under /static/, by name, with their content types. Nothing else is served.
    static let staticFiles: [String: String] = [
        "dashboard.css": "text/css; charset=utf-8",
        "live.js": "text/javascript; charset=utf-8",
        "list.js": "text/javascript; charset=utf-8",
    ]
    static let contentTypeName = "HERALDLAB_HTML"
    static let pragma = "{{% CONTENT_TYPE: \(contentTypeName)}}"

    struct LoadError: Error, CustomStringConvertible {
        var description: String
    }

    /// `OutsideText.html` as swift-mustache's escaping for `{{x}}`.
    struct OutsideHTML: MustacheContentType {
        func escapeText(_ text: String) -> String { OutsideText.html(text) }
    }

    let library: MustacheLibrary
    let files: [String: Data]

    /// Loaded once per process (the files are the build's, they do not change under it).
    static let loaded: Result<DashboardTemplates, LoadError> = Result { try DashboardTemplates(folder: resourceFolder()) }
        .mapError { $0 as? LoadError ?? LoadError(description: "\($0)") }

    static func shared() throws -> DashboardTemplates { try loaded.get() }

    /// SwiftPM's resource bundle of this module, as the build leaves it beside the executable.
    static let bundleName = "HeraldLab_LabCoordinator.resources"

    /// The Dashboard folder: beside the executable (its real path) in SwiftPM's resource bundle
    /// (a build's .build/<config>/, where swift test's runner is too), else in
    /// ../share/herald-lab/dashboard from it (the .deb's /usr/bin/herald-lab reads
    /// /usr/share/herald-lab/dashboard), else in the bundle beside the main bundle. SwiftPM's own
    /// accessor (`Bundle.module`) is not used: it ends the process when its bundle is missing,
    /// where a coordinator whose templates were deleted must say so and which folders it tried.
    static func resourceFolder() throws -> URL { try firstFolder(of: resourceCandidates()) }

    static func resourceCandidates() -> [URL] {
        var candidates = [URL]()
        if let exe = Bundle.main.executableURL?.resolvingSymlinksInPath().deletingLastPathComponent() {
            candidates.append(exe.appendingPathComponent(bundleName).appendingPathComponent("Dashboard"))
            candidates.append(exe.deletingLastPathComponent().appendingPathComponent("share/herald-lab/dashboard"))
        }
        candidates.append(Bundle.main.bundleURL.appendingPathComponent(bundleName).appendingPathComponent("Dashboard"))
        return candidates
    }

    /// The first of `candidates` that is a folder, or an error naming them all.
    static func firstFolder(of candidates: [URL]) throws -> URL {
        for candidate in candidates {
            var folder: ObjCBool = false
            if FileManager.default.fileExists(atPath: candidate.path, isDirectory: &folder), folder.boolValue { return candidate }
        }
        throw LoadError(description: "the dashboard's templates are missing (looked in \(candidates.map(\.path).joined(separator: ", "))): reinstall herald-lab")
    }

    init(folder: URL) throws {
        MustacheContentTypes.register(OutsideHTML(), named: Self.contentTypeName)
        var library = MustacheLibrary()
        for name in Self.templateNames {
            let url = folder.appendingPathComponent("\(name).mustache")
            let text: String
            do { text = try String(contentsOf: url, encoding: .utf8) } catch {
                throw LoadError(description: "dashboard template \(url.path) cannot be read: \(error)")
            }
            guard text.hasPrefix(Self.pragma) else {
                throw LoadError(description: "dashboard template \(url.path) does not open with \(Self.pragma) (its {{x}} would not escape as the dashboard's)")
            }
            do { library.register(try MustacheTemplate(string: text), named: name) } catch {
                throw LoadError(description: "dashboard template \(url.path) does not parse: \(error)")
            }
        }
        var files = [String: Data]()
        for name in Self.staticFiles.keys {
            let url = folder.appendingPathComponent(name)
            do { files[name] = try Data(contentsOf: url) } catch {
                throw LoadError(description: "dashboard file \(url.path) cannot be read: \(error)")
            }
        }
        self.library = library
        self.files = files
    }

    /// `name` rendered with `context` (dictionaries, arrays, strings, numbers, Bools).
    func render(_ name: String, _ context: [String: Any]) -> String {
        guard let out = library.render(context, withTemplate: name) else {
            // The names are this file's own; a missing one was refused at the start.
            preconditionFailure("dashboard template \(name) is not loaded")
        }
        return out
    }
}

/// A template's context without the nil values (a nil kept in `[String: Any]` would count as set).
func mustacheContext(_ pairs: KeyValuePairs<String, Any?>) -> [String: Any] {
    var out = [String: Any]()
    for (k, v) in pairs { if let v { out[k] = v } }
    return out
}
