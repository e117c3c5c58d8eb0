// Text inside HTML and SVG markup (both the page of `kiln report` and its charts): the five
// characters that could end an element, an attribute or an entity become entities, so any text --
// a config value, a tag, a path -- shows as itself. Pure, thread-safe.
#pragma once

#include <string>
#include <string_view>

namespace kiln {

// `text` with & < > " ' as &amp; &lt; &gt; &quot; &#39;, safe in element content and in quoted
// attribute values.
std::string escape_markup(std::string_view text);

}  // namespace kiln
