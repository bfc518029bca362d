// The files of the monitor's web page, built into the binary (cmake/EmbedFiles.cmake): the page
// itself (web/index.html) and the chart library from Debian's libjs-dygraphs with its license, so
// that the monitor serves everything itself and the page loads nothing from elsewhere.
#pragma once

#include <string_view>
#include <vector>

namespace colony::monitor {

struct WebAsset {
  std::string_view path;  // the URL path: "/", "/static/dygraph.min.js", ...
  std::string_view content_type;
  std::string_view body;
};
const std::vector<WebAsset>& WebAssets();

}  // namespace colony::monitor
